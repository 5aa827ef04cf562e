"""Durable runs: a journal in a store that outlives the process, and going on from it.

A :class:`DurableHost` keeps every run it drives in a :class:`RunStore` as it goes (each
turn, each call's result, each request before anyone is told of it, each accepted answer),
so that the store, not memory, is the source of truth: after a crash, a deploy or on
another worker, the run goes on from what was kept. :func:`resume_stored` answers a stored
run without a host. :class:`SqliteRunStore` keeps the journal in one SQLite file;
:class:`MemoryRunStore` is the same store in memory; :class:`PostgresRunStore` keeps it in a
PostgreSQL database that any number of workers share.
"""

from ._begun import BegunRun
from ._host import DurableHost
from ._standalone import resume_stored
from ._store import (
    Accepted,
    LeaseLostError,
    RunStore,
    RunSummary,
    StoredRequest,
    StoredRun,
    StoreEvent,
)
from .postgres._store import PostgresRunStore
from .sqlite._store import MemoryRunStore, SqliteRunStore

__all__ = (
    "DurableHost",
    "BegunRun",
    "RunStore",
    "MemoryRunStore",
    "SqliteRunStore",
    "PostgresRunStore",
    "resume_stored",
    "LeaseLostError",
    "StoredRun",
    "StoredRequest",
    "Accepted",
    "RunSummary",
    "StoreEvent",
)
