"""Keeping secrets out of what we show: messages, reprs, error attributes.

Rules of this module:

- A secret is any value we were given to authenticate with: the API key, the values of
  the headers a user configures, and the credentials in a URL (``https://user:pass@host``).
  :class:`Scrubber` replaces each of them by ``[redacted]`` in any text we are about to
  show, longest first, so that a secret containing a shorter one is not half replaced.
- A short secret (under 16 characters) is replaced as a whole token, never inside a word:
  an edge of it that is a letter, digit, ``-`` or ``_`` must not touch another such
  character. A key ``k`` leaves ``known`` alone (it used to become ``[redacted]nown``),
  while ``key=k&`` and ``"k"`` lose it. A longer secret is replaced wherever it appears,
  even run into other characters (``sk-...xyz`` echoed with a suffix): no prose holds one,
  so nothing is mangled, and a real key is never left half visible.
- A URL is shown without its credentials (:func:`redact_url`): the structure of the URL is
  known, so its userinfo is removed by position, whatever it holds, rather than hoping the
  scrubber recognises it.
- Scrubbing works on text we built or were sent; it is a last line of defence, not a
  licence to put a secret in a message in the first place.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = ("REDACTED", "Scrubber", "redact_url", "url_secrets")

REDACTED = "[redacted]"


_TOKEN_CHAR = "A-Za-z0-9_-"


# From this length on a secret cannot be a word of a message: it is replaced anywhere.
ANYWHERE = 16


def _as_token(secret: str) -> str:
    """A pattern for ``secret`` as a whole token: no token character right before its first
    character or right after its last, where those are token characters themselves (a
    secret of ``ANYWHERE`` characters or more: anywhere)."""
    if len(secret) >= ANYWHERE:
        return re.escape(secret)
    before = f"(?<![{_TOKEN_CHAR}])" if re.match(f"[{_TOKEN_CHAR}]", secret[0]) else ""
    after = f"(?![{_TOKEN_CHAR}])" if re.match(f"[{_TOKEN_CHAR}]", secret[-1]) else ""
    return f"{before}{re.escape(secret)}{after}"


def url_secrets(url: str) -> tuple[str, ...]:
    """The credentials in ``url``'s userinfo, as written and percent-decoded.

    The password when there is one; a user name alone is a token too (``https://TOKEN@host``)
    and counts as a secret then, while a user name next to a password is not one.
    """
    try:
        parts = urlsplit(url)
        username, password = parts.username, parts.password
    except ValueError:  # a malformed port or netloc: no credentials we can read
        return ()
    secret = password if password is not None else username
    if not secret:
        return ()
    return tuple(dict.fromkeys((secret, unquote(secret))))


def redact_url(url: str) -> str:
    """``url`` with its userinfo (``user:pass@``), if any, replaced by ``[redacted]@``.

    >>> redact_url("https://bob:hunter2@api.example.com/v1")
    'https://[redacted]@api.example.com/v1'
    >>> redact_url("https://api.example.com/v1")
    'https://api.example.com/v1'
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{REDACTED}@{host}"))


class Scrubber:
    """Replaces each known secret in a text by ``[redacted]``."""

    __slots__ = ("_pattern", "_secrets")

    def __init__(self, secrets: Iterable[str]) -> None:
        # Longest first: a key that contains a shorter secret is replaced whole.
        self._secrets = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))
        self._pattern = (
            re.compile("|".join(_as_token(secret) for secret in self._secrets))
            if self._secrets
            else None
        )

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def __call__(self, text: str) -> str:
        pattern = self._pattern
        if pattern is None or not any(secret in text for secret in self._secrets):
            return text  # the common case: nothing to look for, no regex pass
        return pattern.sub(REDACTED, text)

    def headers(self, headers: Mapping[str, str]) -> dict[str, str]:
        """``headers`` with every value scrubbed (a server may echo a key in a header)."""
        return {name: self(value) for name, value in headers.items()}
