"""The run store's operations in PostgreSQL as one class, :class:`PgOps` (a run's progress,
``_run_ops``, and answers and leases, ``_answer_ops``, over ``_ops_base``, where their
rules are), and what the group commit notifies of their events: on which channels
(:func:`routes`), saying what (:func:`event_body`).
"""

from __future__ import annotations

import hashlib

from .._store import StoreEvent
from ._answer_ops import PgAnswerOps
from ._run_ops import PgRunOps

__all__ = ("CHANNEL", "LISTENING_LOCK", "PgOps", "event_body", "owner_channel", "routes")

# The channel every store on a database announces every event on, for whoever wants them
# all (``listen()`` with no owner): one notification per transaction, whatever it holds,
# and only while some session listens on it. PostgreSQL (15) wakes every listening
# session of the database at each commit that notifies, whatever the channel; so a
# notification nobody wants would still cost the server a wake-up per listening worker.
CHANNEL = "toolnexus_run_store"

# The session-level advisory lock (shared) a connection LISTENing on CHANNEL holds: how a
# writer sees that someone listens there (``pg_locks``), gone with that connection.
LISTENING_LOCK = 0x546E7841_0002


def owner_channel(owner: str) -> str:
    """The channel of the worker ``owner``: the answers another worker took for the runs
    it holds, told to it alone (a channel name is an identifier of at most 63 bytes)."""
    return "toolnexus_w_" + hashlib.blake2b(owner.encode(), digest_size=12).hexdigest()


def routes(event: StoreEvent, by: str | None = None) -> tuple[str, ...]:
    """The channels ``event`` goes to: every event to :data:`CHANNEL`; an answer taken
    by another worker than ``by`` (the one that took it) and not handed over, also to its
    run's owner, who must wake the run."""
    owner = event.owner
    if event.kind == "answered" and owner is not None and not event.delivered and owner != by:
        return (CHANNEL, owner_channel(owner))
    return (CHANNEL,)


def event_body(event: StoreEvent) -> dict[str, str | bool | None]:
    """What a NOTIFY says of ``event``: the ids it names, never data."""
    body: dict[str, str | bool | None] = {
        "kind": event.kind,
        "request": event.request_id,
        "run": event.run_id,
        "owner": event.owner,
    }
    if event.delivered:
        body["delivered"] = True
    return body


class PgOps(PgRunOps, PgAnswerOps):
    """The operations on the tables of one PostgreSQL schema."""
