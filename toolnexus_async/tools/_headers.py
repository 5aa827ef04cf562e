"""Header values as secrets: ``${NAME}`` read from the environment, what to scrub.

Rules of this module:

- ``${NAME}`` in a value is read from the environment when it is used (a call, a
  connection), never before; a missing variable is a problem that names the variable and
  the header, never a value.
- A value that used a variable is a secret; so is any other value of a header that is not
  merely descriptive (``Content-Type``, ``Accept``, ...), unless the caller says literal
  values are not (an MCP server's ``environment``).
- A secret found in text shown to anyone (a reply, an error) is replaced by ``[redacted]``,
  the longest first.

Shared by the HTTP tools (:mod:`.http`) and the MCP servers' ``headers``, ``environment``
and OAuth client values.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

__all__ = ("expand_headers", "scrub_secrets")

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_REDACTED = "[redacted]"
# Their literal values describe the request, not the caller: scrubbing "application/json"
# from a reply would only confuse the model. A ${VAR} inside them is still scrubbed.
_PLAIN_HEADERS = frozenset(
    {"accept", "accept-encoding", "accept-language", "cache-control", "content-type", "user-agent"}
)


def expand_headers(
    headers: Mapping[str, str], what: str = "header", *, literal_secrets: bool = True
) -> tuple[dict[str, str], list[str], list[str]] | str:
    """``headers`` with each ``${NAME}`` read from the environment: (the values to send,
    the secrets to scrub from any text shown, the names whose values are secrets), or the
    error naming a missing variable (and the ``what`` that needs it, never its value).

    A value that used a variable is a secret; so is any other value of a header that is not
    merely descriptive, unless ``literal_secrets`` is false (then only the values that used
    a variable are). Shared by the HTTP tools and the MCP servers' ``headers`` and
    ``environment``.
    """
    sent: dict[str, str] = {}
    secrets: list[str] = []
    secret_names: list[str] = []
    for key, value in headers.items():
        missing = [n for n in _ENV.findall(value) if n not in os.environ]
        if missing:
            return f"environment variable {missing[0]} is not set (the {key!r} {what} needs it)"
        expanded = _ENV.sub(lambda m: os.environ[m.group(1)], value)
        secrets.extend(os.environ[n] for n in _ENV.findall(value))
        if expanded != value or (literal_secrets and key.lower() not in _PLAIN_HEADERS):
            secrets.append(expanded)
            secret_names.append(key)
        sent[key] = expanded
    # Longest first, so a key is not half-replaced by a shorter value it contains.
    secrets = sorted({s for s in secrets if s.strip()}, key=len, reverse=True)
    return sent, secrets, secret_names


def scrub_secrets(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` replaced, in the order given (longest first, as
    :func:`expand_headers` gives them)."""
    for secret in secrets:
        text = text.replace(secret, _REDACTED)
    return text
