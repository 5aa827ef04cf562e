"""The run store contract, and the in-memory store that keeps to it.

Rules of this module:

- A store holds halted runs only (``status == "pending"``), each filed under every
  outstanding request id of its halted turn, so an answer to any of them finds the run.
- What is stored is the run's JSON text, never the object: a load always builds a fresh
  ``RunResult``, and a run that cannot become JSON is refused when it is saved, not when
  someone tries to resume it.
- ``claim`` is the one way out for a resume: it loads and deletes the whole run in one step
  and leaves a tombstone per request id, so a second resume of the same request is told
  :class:`AlreadyResumedError` instead of running the tools twice.
- A row that cannot be read back is that row's problem: loading it raises
  :class:`StoreError` naming it, and listing skips it with a log line.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from .._closing import FlagClosing
from .._errors import AlreadyResumedError, PayloadError, StoreError, UnknownRequestError, UsageError
from .._results import RunResult
from .._types import Request

__all__ = ("MemoryRunStore", "RunStore", "decode_run", "encode_run")

log = logging.getLogger("toolnexus_async.durable")

# Enough to catch a late duplicate resume (a retried web request, a second worker) while
# keeping the memory of claimed ids bounded.
DEFAULT_REMEMBER = 100_000


@runtime_checkable
class RunStore(Protocol):
    """Where halted runs wait for their answers, possibly across processes.

    Every store is an async context manager; ``aclose()`` does the same as leaving it.
    """

    async def save(self, run: RunResult) -> None:
        """Store a halted run under each outstanding request id of ``run.suspended``.

        Saving a run with the same ``run_id`` again replaces the earlier save, request
        ids included.

        Raises:
            UsageError: the run is not halted (``status != "pending"``) or has no run id.
            PayloadError: the run cannot be written as JSON (e.g. non-JSON metadata).
        """
        ...

    async def load(self, request_id: str) -> RunResult:
        """The stored run that ``request_id`` belongs to, as a fresh object.

        Raises:
            UnknownRequestError: no stored run has that request id.
            StoreError: the stored row is corrupt or foreign; the message names it.
        """
        ...

    async def claim(self, request_id: str) -> RunResult:
        """Load and delete the run of ``request_id``, all of its request ids, atomically.

        Raises:
            AlreadyResumedError: the run was claimed before (by this or another process).
            UnknownRequestError: no run was ever stored under that id (or it was forgotten).
            StoreError: the stored row is corrupt or foreign; it is left in place.
        """
        ...

    async def requests(self) -> list[Request]:
        """The outstanding requests of every stored run, oldest save first.

        Rows that cannot be read are skipped and logged, so one bad row does not hide
        the others.
        """
        ...

    async def aclose(self) -> None:
        """Release what the store holds; idempotent."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def encode_run(run: RunResult) -> tuple[str, list[str]]:
    """The JSON text a store keeps for ``run``, and the request ids to file it under.

    Raises:
        UsageError: ``run`` is not a halted run with a run id and outstanding requests.
        PayloadError: ``run`` cannot be written as JSON.
    """
    if run.status != "pending":
        raise UsageError(f"only a halted run can be stored; run {run.run_id!r} is {run.status!r}")
    if not run.run_id:
        raise UsageError("a run without a run_id cannot be stored")
    ids = [r.request.id for r in run.suspended if r.request is not None]
    if not ids:
        raise UsageError(f"run {run.run_id!r} has no outstanding request to file it under")
    if len(set(ids)) != len(ids):
        raise UsageError(f"run {run.run_id!r} lists a request id twice: {ids}")
    try:
        text = json.dumps(run.to_dict(), ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, PayloadError):
            raise
        # to_dict checks metadata; tool arguments are the other place a non-JSON value hides.
        raise PayloadError(f"run {run.run_id!r} cannot be stored as JSON: {exc}") from None
    return text, ids


def decode_run(text: object, run_id: str, request_id: str | None = None) -> RunResult:
    """Rebuild a stored run, checking that the row is what it claims to be.

    Raises:
        StoreError: the text is not a readable run, or it is another run's, or it is not
            a halted run holding ``request_id``. The message names the row.
    """
    where = f"stored run {run_id!r}" + (f" (request {request_id!r})" if request_id else "")
    try:
        run = RunResult.from_dict(text if isinstance(text, str | bytes) else str(text))
    except PayloadError as exc:
        raise StoreError(f"{where} cannot be read: {exc}") from None
    except Exception as exc:  # a foreign row may trip the parser in ways it did not foresee
        raise StoreError(f"{where} cannot be read: {type(exc).__name__}: {exc}") from None
    if run.run_id != run_id:
        raise StoreError(f"{where} holds another run: {run.run_id!r}")
    if run.status != "pending":
        raise StoreError(f"{where} is not a halted run (status {run.status!r})")
    if request_id is not None and request_id not in outstanding_ids(run):
        raise StoreError(f"{where} has no outstanding request {request_id!r}")
    return run


def outstanding_ids(run: RunResult) -> list[str]:
    """The request ids a halted run waits for, in call order."""
    return [r.request.id for r in run.suspended if r.request is not None]


def outstanding_requests(run: RunResult) -> list[Request]:
    """The requests a halted run waits for, in call order."""
    return [r.request for r in run.suspended if r.request is not None]


class MemoryRunStore(FlagClosing):
    """A :class:`RunStore` in this process's memory, for tests and single-process hosts.

    It keeps each run's JSON text, so it behaves like the durable store: every load is a
    fresh object and a run that is not JSON fails at ``save``. It lives on one event loop;
    its methods never await in the middle, which is what makes ``claim`` atomic.

    Args:
        remember: how many claimed request ids are kept as tombstones, so a repeated
            resume gets :class:`AlreadyResumedError` rather than :class:`UnknownRequestError`.
    """

    _kind = "run store"

    def __init__(self, *, remember: int = DEFAULT_REMEMBER) -> None:
        if remember < 0:
            raise UsageError(f"remember must be >= 0, got {remember}")
        # run_id -> (JSON text, its request ids); dict order is save order.
        self._runs: dict[str, tuple[str, list[str]]] = {}
        self._by_request: dict[str, str] = {}
        self._claimed: OrderedDict[str, str] = OrderedDict()
        self._remember = remember

    def __len__(self) -> int:
        """The number of stored runs."""
        return len(self._runs)

    async def save(self, run: RunResult) -> None:
        self._check_open()
        text, ids = encode_run(run)
        for request_id in ids:
            owner = self._by_request.get(request_id)
            if owner is not None and owner != run.run_id:
                raise UsageError(f"request {request_id!r} is already filed under run {owner!r}")
        self._drop(run.run_id)
        self._runs[run.run_id] = (text, ids)
        for request_id in ids:
            self._by_request[request_id] = run.run_id
            # Put back after a failed resume: the id is outstanding again.
            self._claimed.pop(request_id, None)

    async def load(self, request_id: str) -> RunResult:
        self._check_open()
        run_id = self._find(request_id)
        return decode_run(self._runs[run_id][0], run_id, request_id)

    async def claim(self, request_id: str) -> RunResult:
        self._check_open()
        run_id = self._find(request_id)
        text, ids = self._runs[run_id]
        run = decode_run(text, run_id, request_id)
        self._drop(run_id)
        for claimed in ids:
            self._claimed[claimed] = run_id
        while len(self._claimed) > self._remember:
            self._claimed.popitem(last=False)
        return run

    async def requests(self) -> list[Request]:
        self._check_open()
        out: list[Request] = []
        for run_id, (text, _) in self._runs.items():
            try:
                out.extend(outstanding_requests(decode_run(text, run_id)))
            except StoreError as exc:
                log.warning("skipping a stored run: %s", exc)
        return out

    def _find(self, request_id: str) -> str:
        run_id = self._by_request.get(request_id)
        if run_id is not None:
            return run_id
        if request_id in self._claimed:
            raise AlreadyResumedError(
                request_id,
                f"request {request_id!r} (run {self._claimed[request_id]!r}) was resumed already",
            )
        raise UnknownRequestError(request_id, f"no stored run waits for request {request_id!r}")

    def _drop(self, run_id: str) -> None:
        stored = self._runs.pop(run_id, None)
        if stored is not None:
            for request_id in stored[1]:
                self._by_request.pop(request_id, None)
