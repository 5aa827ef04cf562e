"""The run store's operations on SQLite as one class, :class:`Ops`, which a batch calls on
its transaction's connection (``_batch``): a run's progress (``_run_ops``) and answers
and leases (``_answer_ops``), over what they share (``_ops_base``, with the rules of
every operation); and the MCP tokens kept beside the runs, and the migration of an older
file, which writes its runs through :meth:`Ops.save`."""

from __future__ import annotations

import sqlite3

from ..._core.errors import PayloadError, StoreError, UsageError
from ..._core.results import RunResult
from .._decide import saved
from ._answer_ops import AnswerOps
from ._run_ops import RunOps
from ._schema import SCHEMA_VERSION, UPGRADE_2, UPGRADE_3, UPGRADE_4, UPGRADE_5, create

__all__ = ("Ops", "migrate")


class Ops(RunOps, AnswerOps):
    """The operations of a run store, on one connection, inside its caller's transaction."""

    __slots__ = ()

    def set_mcp_token(self, key: str, value: str | None, now: float) -> None:
        if value is None:
            self.conn.execute("DELETE FROM mcp_tokens WHERE key = ?", (key,))
        else:
            self.conn.execute(
                "INSERT INTO mcp_tokens (key, value, updated) VALUES (?, ?, ?) ON CONFLICT(key)"
                " DO UPDATE SET value = excluded.value, updated = excluded.updated",
                (key, value, now),
            )


# Version n to n + 1, for each n from 2 on.
_UPGRADES = {2: UPGRADE_2, 3: UPGRADE_3, 4: UPGRADE_4, 5: UPGRADE_5}


def migrate(conn: sqlite3.Connection, version: int, path: str) -> None:
    """Bring a file of an earlier schema to the current one, in the caller's transaction:
    one version at a time from 2 on; a version 1 file is rebuilt at the current one."""
    if version in _UPGRADES:
        for step in range(version, SCHEMA_VERSION):
            for statement in _UPGRADES[step]:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return
    if version != 1:
        raise StoreError(f"run store {path} has schema version {version}, which is unknown")
    old = conn.execute("SELECT body FROM runs ORDER BY seq").fetchall()
    for table in ("runs", "requests", "claimed"):
        conn.execute(f"DROP TABLE IF EXISTS {table}")
    create(conn)
    ops = Ops(conn)
    for (body,) in old:
        try:
            ops.save(saved(RunResult.from_dict(body)), 0.0, [])
        except (PayloadError, UsageError) as exc:
            raise StoreError(
                f"run store {path}: a version 1 run cannot be migrated: {exc}"
            ) from None
