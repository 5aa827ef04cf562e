"""The inbox's token and its browsers' login sessions (rule 4 of ``_guard``).

Rules of this module:

- A token is 16 to 512 URL-safe characters: it travels in a URL, a header and a cookie,
  unencoded. :func:`new_token` makes one of 256 random bits.
- A session id is never the token, and sessions are kept by the SHA-256 of their ids, so
  no id is looked up by a comparison a clock could time, and none is in a repr.
- A session ends after :data:`SESSION_IDLE` seconds unused or :data:`SESSION_LIFETIME` in
  all (monotonic time); at most :data:`MAX_SESSIONS` live, a new one ending the least
  recently used.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Callable
from typing import Final

import attrs

from .._core.errors import UsageError

__all__ = (
    "MAX_SESSIONS",
    "SESSION_IDLE",
    "SESSION_LIFETIME",
    "Sessions",
    "check_token",
    "new_token",
)

# Rule 4's bounds. A person logs in from a browser or two; the bound only stops a script
# that logs in over and over from growing the table without end.
MAX_SESSIONS: Final = 256
# A day's work without a request ends the session, and so does a week in all: a copy of
# the cookie (another local server received it) is not good for ever.
SESSION_IDLE: Final = 12 * 3600.0
SESSION_LIFETIME: Final = 7 * 24 * 3600.0

# What a token may be: it travels in a URL, a header and a cookie, unencoded.
_TOKEN = re.compile(r"[A-Za-z0-9._~-]{16,512}")


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def check_token(token: str) -> str:
    """``token`` if it is usable, else :class:`UsageError` saying why."""
    if not _TOKEN.fullmatch(token):
        raise UsageError(
            "a token is 16 to 512 letters, digits or -._~ (make one with "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "backslashreplace")).digest()


@attrs.define
class Sessions:
    """The browsers logged in (rule 4): session ids, each with when it began and was last used.

    ``clock`` is monotonic seconds, so a change of the wall clock neither ends nor prolongs
    a session.
    """

    clock: Callable[[], float] = time.monotonic
    limit: int = MAX_SESSIONS
    idle: float = SESSION_IDLE
    lifetime: float = SESSION_LIFETIME
    # SHA-256 of an id -> (began, last used); least recently used first.
    _live: dict[bytes, tuple[float, float]] = attrs.field(factory=dict, init=False, repr=False)

    def __len__(self) -> int:
        return len(self._live)

    def start(self) -> str:
        """A new session's id, for the cookie."""
        now = self.clock()
        for key, (_, used) in list(self._live.items()):
            if now - used <= self.idle:
                break  # the rest were used later still
            del self._live[key]
        while len(self._live) >= self.limit:
            del self._live[next(iter(self._live))]
        value = secrets.token_urlsafe(32)
        self._live[_digest(value)] = (now, now)
        return value

    def check(self, value: str) -> bool:
        """Whether ``value`` is a live session's id; a use keeps it from going idle."""
        key, now = _digest(value), self.clock()
        times = self._live.pop(key, None)
        if times is None:
            return False
        began, used = times
        if now - used > self.idle or now - began > self.lifetime:
            return False  # ended: popped above for good
        self._live[key] = (began, now)  # now the most recently used
        return True

    @staticmethod
    def handle(value: str) -> str:
        """The principal of the session ``value`` (rule 5): never the id itself."""
        return "session:" + _digest(value).hex()[:12]

    def end(self, value: str) -> None:
        """Forget the session ``value`` names, if it is one."""
        self._live.pop(_digest(value), None)
