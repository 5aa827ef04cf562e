"""The client's configuration values: what bounds a run, and what each request asks for.

Rule of this module: plain frozen values, checked when built (a bad value is a
:class:`UsageError` naming it), so a client is configured with a few named things rather
than twenty keyword arguments, and one value can be shared by many clients.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import attrs

from .errors import UsageError

__all__ = ("DEFAULT_MAX_REPLY_BYTES", "IN_PROCESS_LIMITS", "Limits", "ModelSettings")

# Generous: the longest real replies (long completions, big tool-call arguments) are a few
# MiB; the cap is there so that a broken or hostile endpoint cannot exhaust memory.
DEFAULT_MAX_REPLY_BYTES = 32 * 1024 * 1024


def _seconds(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise UsageError(f"{attribute.name} must be > 0 seconds or None, got {value!r}")
    if not math.isfinite(value):
        raise UsageError(f"{attribute.name} must be finite (None means no limit), got {value!r}")


def _flag(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise UsageError(f"{attribute.name} must be True or False, got {value!r}")


def _positive_int(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{attribute.name} must be an int of at least 1, got {value!r}")


@attrs.frozen
class Limits:
    """How long a run and its requests may take, and how much a reply may weigh.

    Args:
        timeout: seconds a whole run may take (``None``: no limit); over it, the run is
            cancelled and :class:`RunTimeoutError` raised. Time spent waiting for a human
            counts, unless ``count_wait_in_timeout=False`` (then rely on ``expires_at``).
        request_timeout: seconds one attempt of one model request may take, reading the
            reply included (``None``: no limit); over it, the attempt fails with
            :class:`TransportError`, which is retried. The transport applies it.
        count_wait_in_timeout: whether time in ``wait_for`` counts against ``timeout``.
        max_reply_bytes: the largest model reply read, in bytes once decompressed (a
            streamed reply counts all its chunks); a longer one raises
            :class:`ReplyTooLargeError` and is not read further.

    >>> Limits(timeout=30).request_timeout
    600.0
    """

    timeout: float | None = attrs.field(default=None, validator=_seconds)
    request_timeout: float | None = attrs.field(default=600.0, validator=_seconds)
    count_wait_in_timeout: bool = attrs.field(default=True, validator=_flag)
    max_reply_bytes: int = attrs.field(default=DEFAULT_MAX_REPLY_BYTES, validator=_positive_int)


# An in-process model is a function of ours: no request time limit unless asked for (a
# cancel scope per request is a cost the HTTP path does not pay).
IN_PROCESS_LIMITS = Limits(request_timeout=None)


def _max_tokens(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _positive_int(_instance, attribute, value)


MAX_TOKENS_FIELDS = ("max_completion_tokens", "max_tokens")


def _max_tokens_field(_instance: object, _attribute: object, value: object) -> None:
    if value not in MAX_TOKENS_FIELDS:
        raise UsageError(
            f"max_tokens_field must be one of {', '.join(map(repr, MAX_TOKENS_FIELDS))}, "
            f"got {value!r}"
        )


def _extra(_instance: object, _attribute: object, value: Any) -> None:
    if value is not None and not isinstance(value, dict):
        raise UsageError(f"extra_body must be a dict or None, got {type(value).__name__}")


@attrs.frozen
class ModelSettings:
    """What every model request asks for, besides the transcript and the tools.

    Args:
        max_tokens: the reply budget (the anthropic style requires one and sends 4096
            unless set; the openai style sends it only when set).
        extra_body: keys merged into every request body (``temperature``, ...), sent as
            given.
        max_tokens_field: the openai style's name for ``max_tokens`` on the wire:
            ``"max_completion_tokens"`` (OpenAI's, which its reasoning models require), or
            ``"max_tokens"``, the deprecated name, for servers that know only it. The
            anthropic style always sends ``max_tokens``.
    """

    max_tokens: int | None = attrs.field(default=None, validator=_max_tokens)
    extra_body: dict[str, Any] | None = attrs.field(default=None, validator=_extra)
    max_tokens_field: Literal["max_completion_tokens", "max_tokens"] = attrs.field(
        default="max_completion_tokens", validator=_max_tokens_field
    )
