"""When to retry a failed model request, and after how long: decisions only, no waiting.

The rule, in the order it is applied (:meth:`RetryPolicy.delay`):

1. An ``on_error`` verdict of ``"fail"`` gives up at once.
2. No more than ``retries`` retries follow the first attempt; after that, give up.
3. An error is retried when it is *retryable* (a :class:`ProviderError` whose status is in
   ``statuses``, by default 429, 500, 502, 503, 504 and 529, Anthropic's "overloaded", or
   a :class:`TransportError`: the connection failed or timed out) or when the verdict is
   ``"retry"``. Anything else, a :class:`ProtocolError` included, gives up.
4. A provider error whose ``Retry-After`` header is in the delay-seconds form (ASCII
   digits, ``0`` included) waits exactly that long. Any other form, an HTTP-date
   among them, is ignored.
5. Otherwise the wait is exponential backoff, ``base_delay * multiplier ** (attempt - 1)``,
   scaled by a random factor in ``[1 - jitter, 1 + jitter]`` so that clients refused
   together do not all come back at the same instant.
6. No wait is longer than ``max_delay``, not even one a ``Retry-After`` asks for: a hostile
   or mistaken header must not stall a run for hours. The retry count stays the bound.

This module is pure (sans-IO): it never sleeps, reads no clock and does no I/O, and the
randomness is injectable. Only the HTTP shell awaits the delay it returns, so every rule
here is tested with plain calls and no event loop.
"""

from __future__ import annotations

import math
import random as _random
import re
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from .errors import ProviderError, TransportError, UsageError

__all__ = ("RetryPolicy", "parse_retry_after")

# RFC 9110 sets no upper bound on delay-seconds, but 10 digits already reach three
# centuries; a longer value is noise, not a delay, and is treated as absent. The bound also
# keeps int() clear of Python's limit on converting very long digit strings.
_MAX_DIGITS = 10
# [0-9], not \d: \d also matches non-ASCII digits such as "٣", which no HTTP peer sends.
_DELAY_SECONDS = re.compile(rf"[0-9]{{1,{_MAX_DIGITS}}}")

_VERDICTS = (None, "retry", "fail")


def parse_retry_after(value: str | None) -> float | None:
    """The seconds a ``Retry-After`` value asks for, or None when it is not delay-seconds.

    Only the delay-seconds form counts: ASCII digits, surrounding whitespace allowed.
    An HTTP-date, a sign, a fraction, an empty or absurdly long value all give None, and
    the caller falls back to backoff. Nothing is capped here.

    >>> parse_retry_after("7"), parse_retry_after(" 0 ")
    (7.0, 0.0)
    >>> parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None
    True
    >>> parse_retry_after("1.5"), parse_retry_after("-1"), parse_retry_after(None)
    (None, None, None)
    """
    if value is None:
        return None
    match = _DELAY_SECONDS.fullmatch(value.strip())
    return None if match is None else float(match[0])


def _is_number(value: object) -> bool:
    # bool is an int subclass; retries=True is a mistake, not 1.
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_on_error(_instance: object, _attribute: object, value: Any) -> None:
    if value is not None and not callable(value):
        raise UsageError(f"on_error must be callable or None, got {type(value).__name__}")


def _check_retries(_instance: object, _attribute: object, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise UsageError(f"retries must be a whole number >= 0 (0 = no retries), got {value!r}")


def _check_delay(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    # math.isfinite also refuses NaN, which every comparison below would let through.
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        raise UsageError(f"{attribute.name} must be a finite number of seconds >= 0, got {value!r}")


def _check_multiplier(_instance: object, _attribute: object, value: float) -> None:
    if not _is_number(value) or not math.isfinite(value) or value < 1:
        raise UsageError(
            f"multiplier must be a finite number >= 1 (1 = constant delay), got {value!r}"
        )


def _check_jitter(_instance: object, _attribute: object, value: float) -> None:
    # Above 1 the factor 1 - jitter could go negative, i.e. a negative delay.
    if not _is_number(value) or not 0 <= value <= 1:
        raise UsageError(f"jitter must be a fraction between 0 and 1, got {value!r}")


def _to_statuses(value: Iterable[int]) -> frozenset[int]:
    # Accept any iterable ({429, 503}, a list) so callers need not spell frozenset.
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise UsageError(f"statuses must be a collection of HTTP status codes, got {value!r}")
    statuses = frozenset(value)
    for status in statuses:
        if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
            raise UsageError(f"statuses must hold HTTP status codes (100-599), got {status!r}")
    return statuses


@attrs.frozen
class RetryPolicy:
    """How often and how patiently a failed model request is tried again.

    Args:
        retries: retries after the first attempt; 0 means none.
        base_delay: seconds before the first retry, before jitter.
        max_delay: ceiling in seconds for every delay, ``Retry-After`` included.
        multiplier: growth of the delay per retry (>= 1; 1 keeps it constant).
        jitter: the delay is scaled by a random factor in ``[1 - jitter, 1 + jitter]``;
            0 turns randomness off.
        statuses: the HTTP statuses that are retried.
        on_error: ``(error, attempt) -> "retry" | "fail" | None``, sync or async: the
            host's verdict on one failure, overriding the policy's (still bounded by
            ``retries``). The client asks it; :meth:`delay` takes its verdict.

    Invalid values raise :class:`UsageError`.

    >>> policy = RetryPolicy(jitter=0)
    >>> [policy.delay(n, TransportError("reset")) for n in (1, 2, 3)]
    [0.5, 1.0, None]
    """

    retries: int = attrs.field(default=2, validator=_check_retries)
    base_delay: float = attrs.field(default=0.5, validator=_check_delay)
    max_delay: float = attrs.field(default=30.0, validator=_check_delay)
    multiplier: float = attrs.field(default=2.0, validator=_check_multiplier)
    jitter: float = attrs.field(default=0.25, validator=_check_jitter)
    statuses: frozenset[int] = attrs.field(
        default=frozenset({429, 500, 502, 503, 504, 529}), converter=_to_statuses
    )
    on_error: Callable[[Any, int], Any] | None = attrs.field(
        default=None, validator=_check_on_error, eq=False
    )

    def retryable(self, error: BaseException) -> bool:
        """Whether ``error`` is retried by default (without an ``on_error`` verdict).

        >>> policy = RetryPolicy()
        >>> policy.retryable(ProviderError(503, "busy", "u"))
        True
        >>> policy.retryable(ProviderError(400, "bad request", "u"))
        False
        """
        if isinstance(error, ProviderError):
            return error.status in self.statuses
        # A request that got no reply may simply be sent again; a ProtocolError (a 2xx
        # reply we cannot use) would most likely come back the same, so it is not retried.
        return isinstance(error, TransportError)

    def delay(
        self,
        attempt: int,
        error: BaseException,
        *,
        verdict: str | None = None,
        random: Callable[[], float] = _random.random,
    ) -> float | None:
        """Seconds to wait before the next attempt, or None to give up and raise ``error``.

        Args:
            attempt: the number of the attempt that just failed, 1 for the first.
            error: what it failed with.
            verdict: what the user's ``on_error`` classifier said: ``"retry"`` (retry even
                an error not retried by default, still within ``retries``), ``"fail"``
                (never retry) or None (the default rule).
            random: returns a float in ``[0, 1]``; 0 gives the shortest jittered delay,
                1 the longest. The default, :func:`random.random`, never returns 1, so in
                practice the factor stays below ``1 + jitter``.

        >>> policy = RetryPolicy()
        >>> busy = ProviderError(429, "slow down", "u", headers={"Retry-After": "3"})
        >>> policy.delay(1, busy), policy.delay(3, busy)
        (3.0, None)
        >>> policy.delay(1, ProviderError(409, "", "u"), verdict="retry", random=lambda: 1.0)
        0.625
        """
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise UsageError(f"attempt counts from 1 (the first attempt), got {attempt!r}")
        if verdict not in _VERDICTS:
            raise UsageError(f'verdict must be "retry", "fail" or None, got {verdict!r}')
        if verdict == "fail" or attempt > self.retries:
            return None
        if verdict != "retry" and not self.retryable(error):
            return None
        if isinstance(error, ProviderError):
            asked = parse_retry_after(error.headers.get("retry-after"))
            if asked is not None:
                # Honoured as sent, without jitter: the server chose the instant.
                return min(asked, self.max_delay)
        return min(self._backoff(attempt) * self._jitter_factor(random), self.max_delay)

    def _backoff(self, attempt: int) -> float:
        """The un-jittered delay after ``attempt`` failed, capped at ``max_delay``."""
        if self.base_delay == 0:
            return 0.0
        try:
            grown = self.base_delay * self.multiplier ** (attempt - 1)
        except OverflowError:
            # A large retries count can push the power past float range; it is past the
            # cap long before that.
            return self.max_delay
        return min(grown, self.max_delay)

    def _jitter_factor(self, random: Callable[[], float]) -> float:
        draw = random()
        # A bad injected source would otherwise turn into a negative or huge delay.
        if not 0 <= draw <= 1:
            raise UsageError(f"random() must return a float in [0, 1], got {draw!r}")
        return 1 + self.jitter * (2 * draw - 1)
