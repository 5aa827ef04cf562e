"""The run journal's tables in PostgreSQL, created on first use and versioned.

Rules of this module:

- The tables are those of the SQLite store (``_schema``), with the same columns and the
  same partial indexes, in a PostgreSQL schema of their own (``toolnexus`` by default), so
  that the two stores keep one contract and one set of queries in two dialects.
- ``meta`` holds the application's name and the schema version. A schema that holds
  other tables but no ``meta`` row of ours is refused, as is a version newer than this
  release reads; an older version is migrated here, under the same lock (version 2 added
  ``mcp_tokens``, the sign-in state of remote MCP servers).
- Creating the tables takes a transaction-scoped advisory lock first, so that several
  workers starting at once create them once and all see them.
"""

from __future__ import annotations

import re
from typing import Any

from .._errors import StoreError, UsageError

__all__ = ("APPLICATION", "SCHEMA_VERSION", "ensure", "qualified")

APPLICATION = "toolnexus_async run store"
SCHEMA_VERSION = 2

# Any 64-bit number of our own: the advisory lock that serialises schema creation.
_CREATE_LOCK = 0x546E7841_0001

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")

_MCP_TOKENS = """CREATE TABLE {s}.mcp_tokens (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        updated DOUBLE PRECISION NOT NULL)"""

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
        updated DOUBLE PRECISION NOT NULL)""",
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
        delivered INTEGER)""",
    "CREATE INDEX requests_by_run ON {s}.requests (run_id, turn)",
    "CREATE INDEX requests_pending ON {s}.requests (seq) WHERE status = 'pending'",
    "CREATE INDEX requests_expiring ON {s}.requests (expires_at)"
    " WHERE status = 'pending' AND expires_at IS NOT NULL",
    "CREATE INDEX requests_undelivered ON {s}.requests (run_id) WHERE delivered = 0",
    _MCP_TOKENS,
)


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
        if version == 1:  # version 2 added a table, and nothing else
            await conn.execute(_MCP_TOKENS.format(s=schema))
            await conn.execute(
                f"UPDATE {schema}.meta SET value = $1 WHERE key = 'version'", str(SCHEMA_VERSION)
            )
        elif version < SCHEMA_VERSION:
            raise StoreError(f"{where}: schema {schema!r} has unknown version {version}")
