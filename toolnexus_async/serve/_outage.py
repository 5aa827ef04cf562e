"""The run store's outages as the server sees them: told once when one starts, once when it ends.

Rules of this module:

- A store call that fails with :class:`StoreUnavailableError`, in a request handler or in
  the readiness check, marks the store down in the durable host's tenure, which the host's
  own retries report into too: the first failure of an outage, whoever sees it, logs one
  WARNING with the store's message; the others log nothing. A client that retries in a
  loop must not flood the log, and a passing fault has no traceback worth reading.
- While the store is down, :meth:`StoreOutage.watch` (a task in the app's task group) pings
  it every :data:`PROBE_EVERY` seconds. The first success, the probe's, the readiness
  check's or a host renewal's, marks it up and logs one WARNING saying how long it lasted
  (a WARNING too, so that it shows wherever the first did: ``serve`` logs the package's
  INFO and above, and a host that configures no logging still gets WARNING through
  Python's last-resort handler). While the store is up the
  probe sleeps: a healthy server sends the store nothing extra.
- A store error that escapes a handler is answered here, in one place
  (:func:`store_faults`): :class:`StoreUnavailableError` is 503 with ``Retry-After`` (whole
  seconds, at least 1), :class:`DamagedRunError` is 409 naming the run, any other
  :class:`StoreError` is 500. Each message says which, in the store's own words: the stores
  name their server or file and scrub every secret from their messages.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

import anyio
from aiohttp import web

from .._core.errors import DamagedRunError, StoreError, StoreUnavailableError
from ..durable import RunStore
from ..durable._tenure import Tenure
from ._bodies import ApiError

__all__ = ("OUTAGE", "PROBE_EVERY", "StoreOutage", "retry_after", "store_faults")

log = logging.getLogger("toolnexus_async.serve")

# Seconds between two pings of a store that is down: the end of an outage is seen within
# about this long, for one cheap query a second.
PROBE_EVERY = 1.0


def retry_after(exc: StoreUnavailableError) -> int:
    """The ``Retry-After`` of a fault: its hint in whole seconds, at least 1."""
    hint = exc.retry_after
    return max(1, math.ceil(hint)) if math.isfinite(hint) else 1


class StoreOutage:
    """The probe of the run store, and the outage state this server reports into.

    Args:
        store: the app's run store.
        timeout: seconds one ping may take before it counts as a failure (a store that
            hangs is as unavailable as one that refuses).
        probe_every: seconds between two pings while the store is down.

    The state is the durable host's (:attr:`DurableHost.store_health`, given to
    :meth:`attach` when the host opens), so that the host's retries and the server's
    requests tell one outage once, in one log line each way.
    """

    def __init__(
        self, store: RunStore, *, timeout: float, probe_every: float = PROBE_EVERY
    ) -> None:
        self._store = store
        self._timeout = timeout
        self._probe_every = probe_every
        self._health: Tenure | None = None
        # Set when the store goes down, to wake the probe; made by watch(), which runs on
        # the loop, as an anyio Event must be.
        self._wake: anyio.Event | None = None

    def attach(self, health: Tenure) -> None:
        """Report into ``health`` (the host's) from now on."""
        self._health = health

    @property
    def down(self) -> bool:
        return self._health is not None and self._health.down

    def failed(self, exc: StoreUnavailableError) -> None:
        """A store call failed with ``exc``: the outage starts, unless it had."""
        if self._health is not None:
            self._health.store_down(exc)
        if self._wake is not None:
            self._wake.set()

    def recovered(self) -> None:
        """A store call succeeded: the outage, if there was one, is over."""
        if self._health is not None:
            self._health.store_up()

    async def ping(self) -> StoreUnavailableError | None:
        """Reach the store once, within the timeout: None if it answered, else why not.
        Either way the outage is marked as started or over."""
        try:
            with anyio.fail_after(self._timeout):
                await self._store.ping()
        except StoreUnavailableError as exc:
            self.failed(exc)
            return exc
        except TimeoutError:
            where = getattr(self._store, "where", None) or "the run store"
            late = StoreUnavailableError(f"{where} did not answer within {self._timeout:g} s")
            self.failed(late)
            return late
        self.recovered()
        return None

    async def watch(self) -> None:
        """Sleep while the store is up; ping it every ``probe_every`` seconds while down."""
        while True:
            self._wake = anyio.Event()
            if not self.down:
                await self._wake.wait()
            await anyio.sleep(self._probe_every)
            try:
                await self.ping()
            except Exception as exc:  # not a passing fault: still down, and said once
                log.debug("pinging the run store failed: %s", exc, exc_info=True)


OUTAGE = web.AppKey("toolnexus_outage", StoreOutage)


def unavailable(exc: StoreUnavailableError) -> ApiError:
    """The 503 that asks a client to come back once the store is."""
    seconds = retry_after(exc)
    return ApiError(
        503,
        f"the run store is unavailable ({exc}); try again in {seconds} s",
        headers={"Retry-After": str(seconds)},
    )


@web.middleware
async def store_faults(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The third rule of the module docstring, for every handler."""
    try:
        return await handler(request)
    except StoreUnavailableError as exc:
        request.app[OUTAGE].failed(exc)
        raise unavailable(exc) from None
    except DamagedRunError as exc:
        raise ApiError(409, str(exc)) from None
    except StoreError as exc:
        # Not a passing fault: worth a line each time, but the store's message says it all.
        log.error("%s %s: the run store failed: %s", request.method, request.path, exc)
        raise ApiError(500, f"the run store failed: {exc}") from None
