"""The run journal's tables in PostgreSQL, created on first use and versioned.

Rules of this module:

- The tables are those of the SQLite store (``_schema``), with the same columns and the
  same partial indexes, in a PostgreSQL schema of their own (``toolnexus`` by default), so
  that the two stores keep one contract and one set of queries in two dialects.
- ``meta`` holds the application's name and the schema version. A schema that holds
  other tables but no ``meta`` row of ours is refused, as is a version newer than this
  release reads; an older one is migrated here, under the same lock, one version at a
  time (1 to 2: the columns listings filter on, the answer's time and worker, the
  ``events`` table; 2 to 3: ``mcp_tokens``, the sign-in state of remote MCP servers; 3
  to 4: ``answers``, the append-only audit trail of ``_answers``; 4 to 5:
  ``requests.raised_at``, when each request was raised, NULL for those kept before).
- Creating the tables takes a transaction-scoped advisory lock first, so that several
  workers starting at once create them once and all see them.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..._core.errors import StoreError, UsageError

__all__ = ("APPLICATION", "SCHEMA_VERSION", "ensure", "qualified")

APPLICATION = "toolnexus_async run store"
SCHEMA_VERSION = 5

# Any 64-bit number of our own: the advisory lock that serialises schema creation.
_CREATE_LOCK = 0x546E7841_0001

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")

_EVENTS = """CREATE TABLE {s}.events (
        seq BIGSERIAL PRIMARY KEY,
        run_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL)"""

_MCP_TOKENS = """CREATE TABLE {s}.mcp_tokens (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        updated DOUBLE PRECISION NOT NULL)"""

# Version 4: the audit trail (``_answers``), append-only in the database itself.
_ANSWERS = (
    """CREATE TABLE {s}.answers (
        seq BIGSERIAL PRIMARY KEY,
        request_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        outcome TEXT NOT NULL,
        detail TEXT,
        answered_by TEXT,
        worker TEXT,
        digest TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX answers_by_run ON {s}.answers (run_id, seq)",
    """CREATE FUNCTION {s}.answers_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'the answers table is append-only'; END $$""",
    "CREATE TRIGGER answers_no_change BEFORE UPDATE OR DELETE ON {s}.answers"
    " FOR EACH ROW EXECUTE FUNCTION {s}.answers_append_only()",
    "CREATE TRIGGER answers_no_truncate BEFORE TRUNCATE ON {s}.answers"
    " FOR EACH STATEMENT EXECUTE FUNCTION {s}.answers_append_only()",
)

_TABLES = (
    """CREATE TABLE {s}.meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL)""",
    """CREATE TABLE {s}.runs (
        seq BIGSERIAL PRIMARY KEY,
        run_id TEXT NOT NULL UNIQUE,
        status TEXT NOT NULL,
        owner TEXT,
        turn INTEGER NOT NULL,
        state TEXT NOT NULL,
        prompt TEXT NOT NULL,
        final TEXT,
        error TEXT,
        created DOUBLE PRECISION NOT NULL,
        updated DOUBLE PRECISION NOT NULL,
        outcome TEXT,
        text TEXT)""",
    "CREATE INDEX runs_held ON {s}.runs (owner) WHERE owner IS NOT NULL",
    "CREATE INDEX runs_let_go ON {s}.runs (seq) WHERE status = 'running' AND owner IS NULL",
    "CREATE INDEX runs_ended ON {s}.runs (updated) WHERE status IN ('done', 'failed')",
    """CREATE TABLE {s}.workers (
        name TEXT PRIMARY KEY,
        alive_until DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE {s}.results (
        run_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        record TEXT NOT NULL,
        PRIMARY KEY (run_id, call_id))""",
    """CREATE TABLE {s}.requests (
        seq BIGSERIAL PRIMARY KEY,
        request_id TEXT NOT NULL UNIQUE,
        run_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        turn INTEGER NOT NULL,
        body TEXT NOT NULL,
        status TEXT NOT NULL,
        expires_at DOUBLE PRECISION,
        answer TEXT,
        delivered INTEGER,
        kind TEXT,
        prompt TEXT,
        answered_at DOUBLE PRECISION,
        answered_by TEXT,
        raised_at DOUBLE PRECISION)""",
    "CREATE INDEX requests_by_run ON {s}.requests (run_id, turn)",
    "CREATE INDEX requests_pending ON {s}.requests (seq) WHERE status = 'pending'",
    "CREATE INDEX requests_expiring ON {s}.requests (expires_at)"
    " WHERE status = 'pending' AND expires_at IS NOT NULL",
    "CREATE INDEX requests_undelivered ON {s}.requests (run_id) WHERE delivered = 0",
    _EVENTS,
    _MCP_TOKENS,
    *_ANSWERS,
)

_UPGRADE_1 = (
    "ALTER TABLE {s}.runs ADD COLUMN outcome TEXT, ADD COLUMN text TEXT",
    "ALTER TABLE {s}.requests ADD COLUMN kind TEXT, ADD COLUMN prompt TEXT,"
    " ADD COLUMN answered_at DOUBLE PRECISION, ADD COLUMN answered_by TEXT",
    _EVENTS,
)

# Version 4 to 5: when each request was raised (where a traced resume's wait span begins).
_UPGRADE_4 = "ALTER TABLE {s}.requests ADD COLUMN raised_at DOUBLE PRECISION"


def qualified(schema: str) -> str:
    """``schema`` checked as a plain lower-case identifier (it is put into SQL text)."""
    if not isinstance(schema, str) or not _IDENTIFIER.fullmatch(schema):
        raise UsageError(
            f"schema must be a lower-case SQL identifier (letters, digits, _), got {schema!r}"
        )
    return schema


async def ensure(conn: Any, schema: str, where: str) -> None:
    """Create the tables in ``schema`` if they are missing, or check that they are ours and
    current; ``where`` names the database in errors (without credentials)."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _CREATE_LOCK)
        tables = {
            row["table_name"]
            for row in await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1",
                schema,
            )
        }
        if not tables:
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            for statement in _TABLES:
                await conn.execute(statement.format(s=schema))
            await conn.executemany(
                f"INSERT INTO {schema}.meta (key, value) VALUES ($1, $2)",
                [("application", APPLICATION), ("version", str(SCHEMA_VERSION))],
            )
            return
        meta = (
            {
                row["key"]: row["value"]
                for row in await conn.fetch(f"SELECT key, value FROM {schema}.meta")
            }
            if "meta" in tables
            else {}
        )
        if meta.get("application") != APPLICATION:
            raise StoreError(f"{where}: schema {schema!r} holds tables of another application")
        version = int(meta.get("version", "0"))
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{where}: schema {schema!r} has run store version {version}, from a newer"
                f" release; this release reads version {SCHEMA_VERSION}"
            )
        if version == SCHEMA_VERSION:
            return
        if version not in (1, 2, 3, 4):
            raise StoreError(f"{where}: schema {schema!r} has unknown version {version}")
        if version == 1:
            await _upgrade_1(conn, schema)
        if version <= 2:
            await conn.execute(_MCP_TOKENS.format(s=schema))  # version 2 to 3: nothing else
        if version <= 3:
            for statement in _ANSWERS:  # version 3 to 4: nothing else
                await conn.execute(statement.format(s=schema))
        await conn.execute(_UPGRADE_4.format(s=schema))
        await conn.execute(
            f"UPDATE {schema}.meta SET value = $1 WHERE key = 'version'", str(SCHEMA_VERSION)
        )


async def _upgrade_1(conn: Any, schema: str) -> None:
    """Version 1 to 2, in the caller's transaction: the new columns, filled from the JSON
    kept (a value a damaged row cannot give stays NULL), and the events table."""
    for statement in _UPGRADE_1:
        await conn.execute(statement.format(s=schema))
    ended = []
    for run_id, final in await conn.fetch(
        f"SELECT run_id, final FROM {schema}.runs WHERE final IS NOT NULL"
    ):
        value = _json(final)
        ended.append((run_id, value.get("status"), value.get("text")))
    await conn.executemany(
        f"UPDATE {schema}.runs SET outcome = $2, text = $3 WHERE run_id = $1", ended
    )
    asked = []
    for request_id, body in await conn.fetch(f"SELECT request_id, body FROM {schema}.requests"):
        value = _json(body)
        asked.append((request_id, value.get("kind"), value.get("prompt")))
    await conn.executemany(
        f"UPDATE {schema}.requests SET kind = $2, prompt = $3 WHERE request_id = $1", asked
    )


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return {k: v for k, v in value.items() if isinstance(v, str)} if isinstance(value, dict) else {}
