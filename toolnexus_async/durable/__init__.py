"""Durable halted runs: stores that outlive the process, and resuming from them.

A run that halts (``status == "pending"``) is saved with :meth:`RunStore.save`; whoever
receives the answer, in this process or another, calls :func:`resume_stored`, which claims
the run so that only one resume can proceed, resumes it and saves it again if it halts
again. A :class:`DurableHost` does both for every run it drives, parked or stored.
:class:`SqliteRunStore` keeps runs in one SQLite file; :class:`MemoryRunStore` is the same
contract in memory.
"""

from ._host import DurableHost, resume_stored
from ._sqlite import SqliteRunStore
from ._store import MemoryRunStore, RunStore

__all__ = ("DurableHost", "RunStore", "MemoryRunStore", "SqliteRunStore", "resume_stored")
