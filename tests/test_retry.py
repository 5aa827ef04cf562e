"""The pure retry decisions (toolnexus_async/_retry.py): plain calls, no clock, no sleeping."""

from __future__ import annotations

import math

import pytest

from toolnexus_async._core.errors import (
    ModelError,
    ProtocolError,
    ProviderError,
    TransportError,
    UsageError,
)
from toolnexus_async._core.retry import RetryPolicy, parse_retry_after

URL = "https://api.example.test/v1/chat/completions"

# No jitter unless a test is about jitter, so expected delays are exact.
STEADY = RetryPolicy(jitter=0)


def middle() -> float:
    """A random source whose draw makes the jitter factor exactly 1."""
    return 0.5


def provider(status: int, retry_after: str | None = None) -> ProviderError:
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return ProviderError(status, "error body", URL, headers=headers)


# parse_retry_after


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("7", 7.0), ("120", 120.0), ("0", 0.0), ("00", 0.0), (" 7 ", 7.0), ("\t3\r\n", 3.0)],
)
def test_retry_after_delay_seconds(value, seconds):
    """ASCII digits, `0` included and surrounding whitespace stripped, are seconds."""
    assert parse_retry_after(value) == seconds


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "   ",
        "1.5",
        "-1",
        "+5",
        "1 5",
        "12abc",
        "0x10",
        "1e3",
        "Wed, 21 Oct 2015 07:28:00 GMT",
        "\u0663",  # ARABIC-INDIC DIGIT THREE: a digit to str.isdigit, not to HTTP
        "\u00b2",  # SUPERSCRIPT TWO
        "9" * 11,
        "1" * 5000,
    ],
)
def test_retry_after_other_forms_are_ignored(value):
    """Anything but delay-seconds (dates, signs, fractions, junk, absurd lengths) is None."""
    assert parse_retry_after(value) is None


def test_retry_after_is_not_capped_by_the_parser():
    """The parser reports what the server asked; capping is the policy's business."""
    assert parse_retry_after("9999999999") == 9999999999.0


# retryable


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 529])
def test_default_statuses_are_retryable(status):
    """Rate limits and server-side failures are retried by default."""
    assert RetryPolicy().retryable(provider(status))


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422, 501])
def test_other_statuses_are_not_retryable(status):
    """Client errors (and 501, which will not change) are not retried by default."""
    assert not RetryPolicy().retryable(provider(status))


def test_transport_error_is_retryable():
    """A request that got no reply (refused, reset, timed out) may be sent again."""
    assert RetryPolicy().retryable(TransportError("POST failed: connection reset"))


@pytest.mark.parametrize(
    "error",
    [ProtocolError("not JSON"), ModelError("other"), ValueError("bug"), TimeoutError()],
)
def test_other_errors_are_not_retryable(error):
    """A bad 2xx reply, a bug or a bare timeout not mapped by the transport: no retry."""
    assert not RetryPolicy().retryable(error)


def test_custom_statuses_replace_the_default():
    """`statuses` is the whole list: a status left out is no longer retried."""
    policy = RetryPolicy(statuses={409})
    assert policy.retryable(provider(409))
    assert not policy.retryable(provider(503))
    assert policy.statuses == frozenset({409})


# delay: bounds and verdicts


def test_attempts_are_bounded_by_retries():
    """With retries=2 the first two failures are retried and the third gives up."""
    error = provider(503)
    assert STEADY.delay(1, error) is not None
    assert STEADY.delay(2, error) is not None
    assert STEADY.delay(3, error) is None
    assert STEADY.delay(50, error) is None


def test_retries_zero_never_retries():
    """retries=0 gives up on the first failure, whatever the error or verdict."""
    policy = RetryPolicy(retries=0)
    assert policy.delay(1, provider(503)) is None
    assert policy.delay(1, TransportError("reset")) is None
    assert policy.delay(1, provider(503, "1"), verdict="retry") is None


def test_not_retryable_gives_up():
    """Without a verdict, a non-retryable error gives up even on the first attempt."""
    assert STEADY.delay(1, provider(400)) is None
    assert STEADY.delay(1, ProtocolError("not JSON")) is None


def test_verdict_retry_retries_a_non_retryable_error():
    """on_error saying "retry" retries what the default rule would not."""
    assert STEADY.delay(1, provider(409), verdict="retry") == 0.5
    assert STEADY.delay(1, ProtocolError("truncated"), verdict="retry") == 0.5


def test_verdict_retry_is_still_bounded_by_retries():
    """A "retry" verdict cannot exceed the retry budget."""
    assert STEADY.delay(2, provider(409), verdict="retry") == 1.0
    assert STEADY.delay(3, provider(409), verdict="retry") is None


def test_verdict_fail_gives_up_on_a_retryable_error():
    """on_error saying "fail" stops retries of an error retried by default."""
    assert STEADY.delay(1, provider(503), verdict="fail") is None
    assert STEADY.delay(1, TransportError("reset"), verdict="fail") is None
    assert STEADY.delay(1, provider(429, "1"), verdict="fail") is None


def test_verdict_none_is_the_default_rule():
    """verdict=None decides exactly as if no classifier were installed."""
    for error in (provider(503), provider(400), TransportError("x"), ProtocolError("y")):
        assert STEADY.delay(1, error, verdict=None) == STEADY.delay(1, error)


@pytest.mark.parametrize("verdict", ["RETRY", "retyr", "", "ok"])
def test_unknown_verdict_is_refused(verdict):
    """A misspelt verdict is an error, not silently the default rule."""
    with pytest.raises(UsageError, match="verdict"):
        STEADY.delay(1, provider(503), verdict=verdict)


@pytest.mark.parametrize("attempt", [0, -1, True])
def test_attempt_counts_from_one(attempt):
    """attempt is the 1-based number of the failed attempt; anything else is a bug."""
    with pytest.raises(UsageError, match="attempt"):
        STEADY.delay(attempt, provider(503))


# delay: backoff and jitter


def test_backoff_grows_exponentially():
    """Each retry waits base_delay * multiplier ** (attempt - 1)."""
    policy = RetryPolicy(retries=5, base_delay=0.5, multiplier=3, jitter=0)
    delays = [policy.delay(n, provider(500)) for n in range(1, 6)]
    assert delays == [0.5, 1.5, 4.5, 13.5, 30.0]


def test_backoff_is_capped_at_max_delay():
    """Backoff never grows past max_delay."""
    policy = RetryPolicy(retries=10, base_delay=1, max_delay=5, jitter=0)
    delays = [policy.delay(n, provider(500)) for n in range(1, 11)]
    assert delays == [1.0, 2.0, 4.0] + [5.0] * 7


def test_backoff_survives_huge_attempt_numbers():
    """A power past float range is simply the cap, not an OverflowError."""
    policy = RetryPolicy(retries=100_000, jitter=0)
    assert policy.delay(100_000, provider(500)) == 30.0


def test_zero_base_delay_retries_at_once():
    """base_delay=0 means immediate retries, even far into a long retry budget."""
    policy = RetryPolicy(retries=100_000, base_delay=0)
    assert policy.delay(1, provider(500)) == 0.0
    assert policy.delay(100_000, provider(500)) == 0.0


def test_multiplier_one_keeps_the_delay_constant():
    """multiplier=1 waits base_delay before every retry."""
    policy = RetryPolicy(retries=3, base_delay=2, multiplier=1, jitter=0)
    assert [policy.delay(n, provider(500)) for n in (1, 2, 3)] == [2.0, 2.0, 2.0]


def test_jitter_bounds():
    """random=0 gives (1 - jitter) x backoff, random=1 gives (1 + jitter) x backoff."""
    policy = RetryPolicy(base_delay=2, jitter=0.25)
    assert policy.delay(1, provider(503), random=lambda: 0.0) == 1.5
    assert policy.delay(1, provider(503), random=middle) == 2.0
    assert policy.delay(1, provider(503), random=lambda: 1.0) == 2.5


def test_default_jitter_stays_in_bounds():
    """With the real random source every delay lies in [1 - jitter, 1 + jitter) x backoff."""
    policy = RetryPolicy(base_delay=2, jitter=0.25)
    delays = {policy.delay(1, provider(503)) for _ in range(200)}
    assert all(d is not None and 1.5 <= d < 2.5 for d in delays)
    assert len(delays) > 1, "jitter must actually vary the delay"


def test_jitter_zero_ignores_the_random_source():
    """jitter=0 gives the plain backoff whatever random returns."""
    assert STEADY.delay(1, provider(503), random=lambda: 0.0) == 0.5
    assert STEADY.delay(1, provider(503), random=lambda: 1.0) == 0.5


def test_jittered_delay_never_exceeds_max_delay():
    """max_delay is a ceiling after jitter too, so jitter only shortens a capped delay."""
    policy = RetryPolicy(retries=10, base_delay=1, max_delay=5, jitter=0.5)
    assert policy.delay(10, provider(500), random=lambda: 1.0) == 5.0
    assert policy.delay(10, provider(500), random=lambda: 0.0) == 2.5


@pytest.mark.parametrize("draw", [-0.1, 1.1, math.nan])
def test_random_source_out_of_range_is_refused(draw):
    """A random source outside [0, 1] would make negative or huge delays; it is refused."""
    with pytest.raises(UsageError, match="random"):
        RetryPolicy().delay(1, provider(503), random=lambda: draw)


# delay: Retry-After


def test_retry_after_is_honoured_exactly():
    """A delay-seconds Retry-After replaces backoff and gets no jitter."""
    policy = RetryPolicy(jitter=0.5)
    assert policy.delay(1, provider(429, "7"), random=lambda: 0.0) == 7.0
    assert policy.delay(2, provider(503, "7"), random=lambda: 1.0) == 7.0


def test_retry_after_zero_retries_at_once():
    """Retry-After: 0 means retry now, not fall back to backoff."""
    assert RetryPolicy().delay(1, provider(429, "0"), random=lambda: 1.0) == 0.0


def test_retry_after_is_capped_at_max_delay():
    """A Retry-After longer than max_delay waits max_delay, so no header stalls a run."""
    assert RetryPolicy(max_delay=30).delay(1, provider(429, "3600")) == 30.0


@pytest.mark.parametrize("value", ["Wed, 21 Oct 2015 07:28:00 GMT", "1.5", "-1", "", "soon"])
def test_other_retry_after_forms_fall_back_to_backoff(value):
    """An unusable Retry-After is ignored and the backoff applies."""
    assert STEADY.delay(2, provider(503, value)) == 1.0


def test_retry_after_header_name_is_case_insensitive():
    """ProviderError lower-cases header names, so any spelling of the header is read."""
    for name in ("Retry-After", "retry-after", "RETRY-AFTER"):
        error = ProviderError(429, "", URL, headers={name: "4"})
        assert STEADY.delay(1, error) == 4.0


def test_retry_after_does_not_make_an_error_retryable():
    """A Retry-After on a status not retried does not override the rule by itself."""
    assert STEADY.delay(1, provider(400, "1")) is None


def test_retry_after_applies_under_a_retry_verdict():
    """When on_error retries a non-retryable status, its Retry-After is still honoured."""
    assert STEADY.delay(1, provider(409, "2"), verdict="retry") == 2.0


def test_retry_after_does_not_extend_the_budget():
    """Retry-After changes how long, never how many times."""
    assert STEADY.delay(3, provider(429, "1")) is None


# validation


def test_defaults():
    """The defaults are the documented ones."""
    policy = RetryPolicy()
    assert (policy.retries, policy.base_delay, policy.max_delay) == (2, 0.5, 30.0)
    assert (policy.multiplier, policy.jitter) == (2.0, 0.25)
    assert policy.statuses == frozenset({429, 500, 502, 503, 504, 529})


def test_policy_is_frozen():
    """A policy shared by clients cannot be changed under them."""
    policy = RetryPolicy()
    with pytest.raises(AttributeError):
        policy.retries = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"retries": -1}, "retries"),
        ({"retries": 1.5}, "retries"),
        ({"retries": True}, "retries"),
        ({"base_delay": -0.1}, "base_delay"),
        ({"base_delay": math.nan}, "base_delay"),
        ({"base_delay": "1"}, "base_delay"),
        ({"max_delay": -1}, "max_delay"),
        ({"max_delay": math.inf}, "max_delay"),
        ({"multiplier": -2}, "multiplier"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"multiplier": math.nan}, "multiplier"),
        ({"jitter": -0.1}, "jitter"),
        ({"jitter": 1.5}, "jitter"),
        ({"jitter": math.nan}, "jitter"),
        ({"statuses": {429, 99}}, "statuses"),
        ({"statuses": {"429"}}, "statuses"),
        ({"statuses": "429"}, "statuses"),
        ({"statuses": 429}, "statuses"),
    ],
)
def test_invalid_values_are_refused(kwargs, field):
    """Each invalid setting raises UsageError (a ValueError) naming the setting."""
    with pytest.raises(UsageError, match=field) as caught:
        RetryPolicy(**kwargs)
    assert isinstance(caught.value, ValueError)


def test_boundary_values_are_accepted():
    """Zero retries, zero delays, multiplier 1, jitter 0 and 1 are all valid settings."""
    RetryPolicy(retries=0, base_delay=0, max_delay=0, multiplier=1, jitter=0)
    full = RetryPolicy(jitter=1)
    assert full.delay(1, provider(503), random=lambda: 0.0) == 0.0
