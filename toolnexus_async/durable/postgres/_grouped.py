"""The writes of a batch that are alike, as one statement for them all (group commit).

Rules of this module:

- The writes of one batch came from callers that were all waiting at once: none of them
  saw another's outcome, so any order of them within the batch is one they could have
  had. The group commit (``_committer``) may therefore run the writes of one kind (every
  start of the batch, every turn, ...) as one statement over arrays (``unnest``) here: a
  round trip per kind and batch, not per write.
- Each statement does what the single write does (``_statements``), row by row, and
  returns the keys of the rows it wrote. A write whose row it did not write (refused: the
  run not held, the id taken) is :data:`AGAIN`: the group commit then runs that write
  alone, in the same transaction, which finds why and refuses it as it always did. Two
  writes of one kind on the same key (which the arrays cannot tell apart) are all
  :data:`AGAIN`; of two answers to one request, the later.
- Answers lock their requests first, in the order of their ids, all in the statement
  that begins their batch; the run writes lock a run first. The store commits the two in
  batches of their own (``PostgresRunStore``), so no transaction takes both kinds of lock
  in two orders.
- Their events are inserted in the writes' order, after the rows (as ``_statements``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..._core.errors import StoreError
from ..._core.wire import claim_refusal
from .._answers import COLUMNS, taken_row
from .._decide import accepted, judge
from .._run_events import EventRow, answered
from .._store import Accepted

__all__ = ("AGAIN", "Grouped")

# A write of a group that must run alone (see the module rules).
AGAIN: Any = object()

Many = Callable[[Any, Sequence[tuple[Any, ...]]], Awaitable[list[Any]]]

_HELD = "r.run_id = t.id AND r.owner = t.o AND r.status = 'running'"


def _events(s: str, gate: str) -> str:
    """Insert the events (arrays ``$e1..$e5``: the key of the write each is of, run id,
    kind, data, time) of the writes whose key ``gate`` returned, in their order."""
    return (
        f"INSERT INTO {s}.events (run_id, kind, data, at) SELECT v.r, v.k, v.d, v.a"
        " FROM unnest($e1::text[], $e2::text[], $e3::text[], $e4::text[], $e5::float8[])"
        f" WITH ORDINALITY AS v(key, r, k, d, a, i) WHERE v.key IN (SELECT key FROM {gate})"
        " ORDER BY v.i"
    )


def _numbered(sql: str, first: int) -> str:
    """``$e1..$e5`` made ``$first..$first+4``."""
    for n in range(1, 6):
        sql = sql.replace(f"$e{n}", f"${first + n - 1}")
    return sql


def _flat(
    keys: Sequence[str], events: Sequence[Sequence[EventRow]], nows: Sequence[float]
) -> tuple[list[str], list[str], list[str], list[str], list[float]]:
    """The events of each write (with its key and time) as the arrays of :func:`_events`."""
    rows = [
        (key, *row, now)
        for key, per_write, now in zip(keys, events, nows, strict=True)
        for row in per_write
    ]
    return (
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [r[3] for r in rows],
        [r[4] for r in rows],
    )


def _unique(keys: Sequence[Any]) -> bool:
    return len(set(keys)) == len(keys)


# The key a record's write is known by: its run and call (one text).
_CALL_KEY = "run_id || chr(31) || call_id"


class Grouped:
    """The grouped writes of one schema ``s``: ``many[op]`` for each op of ``ops`` that
    has one, called with the argument tuples of its writes (after the connection)."""

    def __init__(self, s: str, ops: Any) -> None:
        self.s = s
        self.many: dict[Any, Many] = {
            ops.start: self.start,
            ops.turn: self.turn,
            ops.suspend: self.suspend,
            ops.record: self.record,
            ops.finish: self.finish,
        }
        # Answers commit in transactions of their own (``PostgresRunStore``).
        self.answers: dict[Any, Many] = {ops.accept: self.accept}
        self._start = _numbered(
            f"WITH r AS (INSERT INTO {s}.runs (run_id, status, owner, turn, state, prompt,"
            " created, updated) SELECT t.id, 'running', t.o, t.tu, t.st, t.pr, t.n, t.n"
            " FROM unnest($1::text[], $2::text[], $3::int[], $4::text[], $5::text[],"
            " $6::float8[]) WITH ORDINALITY AS t(id, o, tu, st, pr, n, i) ORDER BY t.i"
            " ON CONFLICT (run_id) DO NOTHING RETURNING run_id AS key, owner, created),"
            # Each owner's lease row only when it has none that still runs (PgOps._known).
            f" w AS (INSERT INTO {s}.workers (name, alive_until) SELECT r.owner, max(l.u)"
            " FROM r JOIN unnest($1::text[], $7::float8[]) AS l(id, u) ON l.id = r.key"
            f" WHERE NOT EXISTS (SELECT 1 FROM {s}.workers x WHERE x.name = r.owner"
            " AND x.alive_until >= r.created) GROUP BY r.owner ON CONFLICT (name) DO UPDATE"
            f" SET alive_until = GREATEST({s}.workers.alive_until, excluded.alive_until)),"
            f" e AS ({_events(s, 'r')})"
            " SELECT key FROM r",
            8,
        )
        self._turn = _numbered(
            f"WITH u AS (UPDATE {s}.runs r SET turn = t.tu, state = t.st, updated = t.n"
            " FROM unnest($1::text[], $2::text[], $3::int[], $4::text[], $5::float8[])"
            f" AS t(id, o, tu, st, n) WHERE {_HELD} RETURNING r.run_id AS key, t.tu AS tu),"
            f" d AS (DELETE FROM {s}.results x USING u WHERE x.run_id = u.key AND u.tu > 1),"
            f" c AS (UPDATE {s}.requests q SET status = CASE q.status WHEN 'pending'"
            " THEN 'closed' ELSE q.status END, delivered = 1 FROM u WHERE q.run_id = u.key"
            " AND u.tu > 1 AND q.turn < u.tu AND (q.status = 'pending' OR q.delivered = 0)),"
            f" e AS ({_events(s, 'u')})"
            " SELECT key FROM u",
            6,
        )
        self._suspend = _numbered(
            f"WITH q AS (INSERT INTO {s}.requests (request_id, run_id, call_id, turn, body,"
            " status, expires_at, kind, prompt, raised_at) SELECT t.q, r.run_id, t.c, r.turn,"
            " t.b, 'pending', t.x, t.k, t.p, t.n FROM unnest($1::text[], $2::text[],"
            " $3::text[], $4::text[], $5::text[], $6::float8[], $7::text[], $8::text[],"
            " $9::float8[]) WITH ORDINALITY AS t(id, o, q, c, b, x, k, p, n, i)"
            f" JOIN {s}.runs r ON {_HELD} ORDER BY t.i"
            " ON CONFLICT (request_id) DO NOTHING RETURNING request_id AS key),"
            f" e AS ({_events(s, 'q')})"
            " SELECT key FROM q",
            10,
        )
        self._record = _numbered(
            f"WITH x AS (INSERT INTO {s}.results (run_id, call_id, record)"
            " SELECT t.id, t.c, t.rec FROM unnest($1::text[], $2::text[], $3::text[],"
            " $4::text[]) WITH ORDINALITY AS t(id, o, c, rec, i)"
            f" WHERE EXISTS (SELECT 1 FROM {s}.runs r WHERE {_HELD}) ORDER BY t.i"
            " ON CONFLICT (run_id, call_id) DO UPDATE SET record = excluded.record"
            f" RETURNING {_CALL_KEY} AS key),"
            # A result stored already as it is (a write retried after its reply was
            # lost: it had committed) is told once: not its event again. (The statement
            # reads the table as it was before its insert.)
            f" y AS (SELECT key FROM x WHERE key NOT IN (SELECT {_CALL_KEY} FROM {s}.results"
            " JOIN unnest($1::text[], $3::text[], $4::text[]) AS k(id, c, rec)"
            " ON run_id = k.id AND call_id = k.c AND record = k.rec)),"
            f" e AS ({_events(s, 'y')})"
            " SELECT key FROM x",
            5,
        )
        self._finish = _numbered(
            f"WITH u AS (UPDATE {s}.runs r SET status = 'done', owner = NULL, final = t.f,"
            " updated = t.n, outcome = t.oc, text = t.tx FROM unnest($1::text[], $2::text[],"
            " $3::text[], $4::text[], $5::text[], $6::float8[]) AS t(id, o, f, oc, tx, n)"
            f" WHERE {_HELD} RETURNING r.run_id AS key),"
            f" d AS (DELETE FROM {s}.results x USING u WHERE x.run_id = u.key),"
            f" c AS (UPDATE {s}.requests q SET status = CASE q.status WHEN 'pending'"
            " THEN 'closed' ELSE q.status END, delivered = 1 FROM u WHERE q.run_id = u.key"
            " AND (q.status = 'pending' OR q.delivered = 0)),"
            f" e AS ({_events(s, 'u')})"
            " SELECT key FROM u",
            7,
        )

        # The requests answered, locked in one order (two batches never wait on each
        # other in a circle over them), with what ``_decide.judge`` needs (PgOps.accept).
        self._lock = (
            "SELECT q.request_id, q.body, q.run_id, q.call_id, q.status, q.expires_at, r.owner,"
            " w.alive_until, r.status, q.turn = r.turn"
            f" FROM {s}.requests q JOIN {s}.runs r USING (run_id)"
            f" LEFT JOIN {s}.workers w ON w.name = r.owner"
            " WHERE q.request_id = ANY($1) ORDER BY q.request_id FOR UPDATE OF q"
        )
        self._take = _numbered(
            f"WITH u AS (UPDATE {s}.requests q SET status = 'answered', answer = t.a,"
            " delivered = t.d, answered_at = t.n, answered_by = t.b FROM unnest($1::text[],"
            " $2::text[], $3::int[], $4::float8[], $5::text[]) AS t(id, a, d, n, b)"
            " WHERE q.request_id = t.id AND q.status = 'pending' RETURNING q.request_id AS key),"
            f" a AS (INSERT INTO {s}.answers ({COLUMNS}) SELECT * FROM unnest($6::text[],"
            " $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[],"
            " $13::text[], $14::float8[])),"
            f" e AS ({_events(s, 'u')})"
            " SELECT key FROM u",
            15,
        )

    # Each takes the argument tuples of its op (``PgOps``), after the connection.

    async def accept(self, conn: Any, writes: Sequence[tuple[Any, ...]]) -> list[Any]:
        # (answer_id, answer, now, delivered, claim, ok, reason, by, answered_by); one that
        # is refused, or marks its request expired, goes alone (PgOps.accept records why).
        # Every request of the batch is locked here, once and in one order, before anything
        # else: the writes that go alone after lock nothing more, so no two batches of
        # answers wait on each other in a circle. Of two answers to one request, the later
        # goes alone and finds it answered.
        keys = sorted(set(_col(writes, 0)))
        found = {row[0]: tuple(row[1:]) for row in await conn.fetch(self._lock, keys)}
        outcomes: list[Any] = []
        takes: list[tuple[tuple[Any, ...], Accepted]] = []
        seen: set[str] = set()
        for write in writes:
            answer_id, now, claim = write[0], write[2], write[4]
            if answer_id in seen:
                outcomes.append(AGAIN)
                continue
            seen.add(answer_id)
            values = found.get(answer_id)
            refusal, expire = judge(answer_id, values, now)
            taken: Accepted | None = None
            if refusal is None and not expire and values is not None:
                try:
                    taken = accepted(values)
                except StoreError:
                    taken = None
            if taken is None or claim_refusal(taken.request, claim) is not None:
                outcomes.append(AGAIN)
                continue
            outcomes.append(taken)
            takes.append((write, taken))
        if not takes:
            return outcomes
        ids = [w[0] for w, _ in takes]
        nows = [w[2] for w, _ in takes]
        events = [[answered(t.run_id, w[5], w[6], w[0], w[2], w[7], w[8])] for w, t in takes]
        audit = [
            taken_row(t.request, t.run_id, t.call_id, w[5], w[6], w[8], w[7], w[2])
            for w, t in takes
        ]
        rows = await conn.fetch(
            self._take,
            ids,
            [w[1] for w, _ in takes],
            [int(w[3]) for w, _ in takes],
            nows,
            [w[7] for w, _ in takes],
            *([row[n] for row in audit] for n in range(9)),
            *_flat(ids, events, nows),
        )
        # Locked above and judged pending: each is written (else the batch is undone).
        if len(rows) != len(takes):
            raise StoreError(f"{len(takes) - len(rows)} answers locked as pending were not taken")
        return outcomes

    async def start(self, conn: Any, writes: Sequence[tuple[Any, ...]]) -> list[Any]:
        # (run_id, owner, lease_until, turn, state, prompt, now, events)
        keys = [w[0] for w in writes]
        nows = [w[6] for w in writes]
        return await self._run(
            conn,
            self._start,
            keys,
            (keys, _col(writes, 1), _col(writes, 3), _col(writes, 4), _col(writes, 5), nows),
            _col(writes, 2),
            _flat(keys, _col(writes, 7), nows),
        )

    async def turn(self, conn: Any, writes: Sequence[tuple[Any, ...]]) -> list[Any]:
        # (run_id, turn, owner, state, now, events)
        keys = [w[0] for w in writes]
        nows = _col(writes, 4)
        return await self._run(
            conn,
            self._turn,
            keys,
            (keys, _col(writes, 2), _col(writes, 1), _col(writes, 3), nows),
            _flat(keys, _col(writes, 5), nows),
        )

    async def suspend(self, conn: Any, writes: Sequence[tuple[Any, ...]]) -> list[Any]:
        # (run_id, call_id, owner, request_id, body, expires_at, kind, prompt, event, now)
        keys = _col(writes, 3)
        nows = _col(writes, 9)  # when each request was raised
        columns = (
            _col(writes, 0),
            _col(writes, 2),
            keys,
            *(_col(writes, n) for n in (1, 4, 5, 6, 7)),
            nows,
        )
        events = [[w[8]] for w in writes]
        return await self._run(conn, self._suspend, keys, columns, _flat(keys, events, nows))

    async def record(self, conn: Any, writes: Sequence[tuple[Any, ...]]) -> list[Any]:
        # (run_id, call_id, owner, record, event, request_id, now); one that may have to
        # tell an expiry first goes alone (``PgOps.record`` checks its request).
        if any(w[5] is not None for w in writes):
            return [AGAIN] * len(writes)
        keys = [f"{w[0]}\x1f{w[1]}" for w in writes]
        columns = (_col(writes, 0), _col(writes, 2), _col(writes, 1), _col(writes, 3))
        events = [[w[4]] for w in writes]
        return await self._run(
            conn, self._record, keys, columns, _flat(keys, events, _col(writes, 6))
        )

    async def finish(self, conn: Any, writes: Sequence[tuple[Any, ...]]) -> list[Any]:
        # (run_id, owner, final, now, outcome, text, event)
        keys = [w[0] for w in writes]
        nows = _col(writes, 3)
        columns = (keys, _col(writes, 1), _col(writes, 2), _col(writes, 4), _col(writes, 5), nows)
        events = [[w[6]] for w in writes]
        return await self._run(conn, self._finish, keys, columns, _flat(keys, events, nows))

    @staticmethod
    async def _run(conn: Any, sql: str, keys: list[str], *arrays: Sequence[Any]) -> list[Any]:
        """Run a grouped statement: ``None`` (done) for each write whose key it returned,
        :data:`AGAIN` for the others (all of them when two share a key)."""
        if not _unique(keys):
            return [AGAIN] * len(keys)
        args = [
            value for group in arrays for value in (group if isinstance(group, tuple) else (group,))
        ]
        written = {row[0] for row in await conn.fetch(sql, *args)}
        return [None if key in written else AGAIN for key in keys]


def _col(writes: Sequence[tuple[Any, ...]], n: int) -> list[Any]:
    return [w[n] for w in writes]
