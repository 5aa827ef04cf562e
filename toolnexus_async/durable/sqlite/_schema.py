"""The run journal's tables, and how values become their columns.

Rules of this module:

- The tables (schema version 6): ``runs`` (one row per run: status, owner, the current
  turn, the run's state through that turn as JSON, its final JSON, and the outcome and
  text a listing shows), ``workers`` (each worker's lease: one row covers every run it
  holds), ``results`` (the current turn's recorded calls), ``requests`` (every request of
  a run, pending, answered, expired or closed, with its kind and prompt for listings, its
  answer, when and through which worker it was taken, and whether its run has it; kept
  after the run ends, so a late answer is told what happened), ``events`` (what happened
  to each run, in commit order: ``_run_events``), ``mcp_tokens`` (the sign-in state of
  remote MCP servers, :class:`toolnexus_async.mcp.RunStoreTokens`'s: opaque JSON by key),
  ``answers`` (every answer given, who gave it and what it was shown: append-only, kept
  past its run: ``_answers``). The ``answered_by`` column of ``requests`` names the
  *worker* that took the answer (its name predates the audit trail); who gave it is in
  ``answers``. Files of versions 1 (halted runs only), 2 (no listing columns, no
  ``events``), 3 (no ``mcp_tokens``), 4 (no ``answers``) and 5 (no ``requests.raised_at``:
  their requests keep it unknown, NULL) are migrated when opened, one version at a time
  (``_ops.migrate``).
- The indexes are partial where a query only ever looks at a few rows (held runs, runs
  let go, ended runs, pending, expiring and undelivered requests), so that the periodic
  queries of a host (what can go on, what to hand over) cost what they find, not what the
  store holds.
- How values become these columns, and rows values again, is ``durable/_rows``'s, shared
  with the PostgreSQL store.
"""

from __future__ import annotations

import sqlite3

__all__ = (
    "ANSWERS",
    "APPLICATION_ID",
    "EVENTS",
    "MCP_TOKENS",
    "SCHEMA_VERSION",
    "UPGRADE_2",
    "UPGRADE_3",
    "UPGRADE_4",
    "UPGRADE_5",
    "create",
)

# "TnxA": SQLite's header field for telling one application's files from another's.
APPLICATION_ID = 0x546E7841
SCHEMA_VERSION = 6

# The statuses of a run that is not over, and of one that is. Queries spell them exactly
# so: SQLite uses a partial index only for a query whose WHERE implies the index's.
OPEN = "('running', 'halted')"
ENDED = "('done', 'failed')"

# AUTOINCREMENT: a seq is never given twice, even once the newest events were pruned.
EVENTS = """CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL,
        at REAL NOT NULL)"""

# Version 4: the sign-in state of remote MCP servers (secrets: never logged).
MCP_TOKENS = """CREATE TABLE mcp_tokens (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        updated REAL NOT NULL)"""

# Version 5: the audit trail (``_answers``), its index, and the triggers that keep it
# append-only (RAISE(ABORT) undoes the statement, and SQLite reports it as an error).
ANSWERS = (
    """CREATE TABLE answers (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        request_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        outcome TEXT NOT NULL,
        detail TEXT,
        answered_by TEXT,
        worker TEXT,
        digest TEXT NOT NULL,
        at REAL NOT NULL)""",
    "CREATE INDEX answers_by_run ON answers(run_id, seq)",
    "CREATE TRIGGER answers_no_update BEFORE UPDATE ON answers"
    " BEGIN SELECT RAISE(ABORT, 'the answers table is append-only'); END",
    "CREATE TRIGGER answers_no_delete BEFORE DELETE ON answers"
    " BEGIN SELECT RAISE(ABORT, 'the answers table is append-only'); END",
)

SCHEMA = (
    """CREATE TABLE runs (
        seq INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL UNIQUE,
        status TEXT NOT NULL,
        owner TEXT,
        turn INTEGER NOT NULL,
        state TEXT NOT NULL,
        prompt TEXT NOT NULL,
        final TEXT,
        error TEXT,
        created REAL NOT NULL,
        updated REAL NOT NULL,
        outcome TEXT,
        text TEXT)""",
    "CREATE INDEX runs_held ON runs(owner) WHERE owner IS NOT NULL",
    "CREATE INDEX runs_let_go ON runs(seq) WHERE status = 'running' AND owner IS NULL",
    f"CREATE INDEX runs_ended ON runs(updated) WHERE status IN {ENDED}",
    # A worker's lease covers every run it holds: renewing it is one row, however many.
    """CREATE TABLE workers (
        name TEXT PRIMARY KEY,
        alive_until REAL NOT NULL)""",
    """CREATE TABLE results (
        run_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        record TEXT NOT NULL,
        PRIMARY KEY (run_id, call_id))""",
    # status: pending, answered, expired, or closed (its run ended without it).
    # delivered: NULL while pending; 0 once answered or expired and not yet handed to its
    # run; 1 once handed over (or the run went on without it).
    """CREATE TABLE requests (
        seq INTEGER PRIMARY KEY,
        request_id TEXT NOT NULL UNIQUE,
        run_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        turn INTEGER NOT NULL,
        body TEXT NOT NULL,
        status TEXT NOT NULL,
        expires_at REAL,
        answer TEXT,
        delivered INTEGER,
        kind TEXT,
        prompt TEXT,
        answered_at REAL,
        answered_by TEXT,
        raised_at REAL)""",
    "CREATE INDEX requests_by_run ON requests(run_id, turn)",
    "CREATE INDEX requests_pending ON requests(seq) WHERE status = 'pending'",
    "CREATE INDEX requests_expiring ON requests(expires_at)"
    " WHERE status = 'pending' AND expires_at IS NOT NULL",
    "CREATE INDEX requests_undelivered ON requests(run_id) WHERE delivered = 0",
    EVENTS,
    MCP_TOKENS,
    *ANSWERS,
)

# Version 2 to 3: what listings filter on, when and by whom an answer came, the events.
# A value that cannot be read from a damaged row's JSON stays NULL (json_valid).
UPGRADE_2 = (
    "ALTER TABLE runs ADD COLUMN outcome TEXT",
    "ALTER TABLE runs ADD COLUMN text TEXT",
    "ALTER TABLE requests ADD COLUMN kind TEXT",
    "ALTER TABLE requests ADD COLUMN prompt TEXT",
    "ALTER TABLE requests ADD COLUMN answered_at REAL",
    "ALTER TABLE requests ADD COLUMN answered_by TEXT",
    "UPDATE runs SET outcome = json_extract(final, '$.status'),"
    " text = json_extract(final, '$.text') WHERE final IS NOT NULL AND json_valid(final)",
    "UPDATE requests SET kind = json_extract(body, '$.kind'),"
    " prompt = json_extract(body, '$.prompt') WHERE json_valid(body)",
    EVENTS,
)

# Version 3 to 4: a table, and nothing else.
UPGRADE_3 = (MCP_TOKENS,)

# Version 4 to 5: the audit trail, and nothing else.
UPGRADE_4 = ANSWERS

# Version 5 to 6: when each request was raised (where a traced resume's wait span begins).
UPGRADE_5 = ("ALTER TABLE requests ADD COLUMN raised_at REAL",)


def create(conn: sqlite3.Connection) -> None:
    """Create the tables of a new file and stamp it."""
    for statement in SCHEMA:
        conn.execute(statement)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
