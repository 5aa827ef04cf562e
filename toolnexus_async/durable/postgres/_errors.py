"""How :class:`PostgresRunStore` tells a failure of its database: which server, which kind.

Rules of this module:

- The DSN may hold a password: it is never shown. Errors name the database as
  ``host:port/dbname`` only (:func:`where`), and asyncpg's own messages are scrubbed of
  the DSN's secrets before they are shown.
- A passing fault (:func:`passing`: the connection, the server stopping, too few
  resources, a lock or a conflict) is a :class:`StoreUnavailableError`, to be retried
  later; every other failure of the database is a plain :class:`StoreError`.
- An outage is told once (by the host: ``_tenure``), never with a traceback per retry:
  asyncpg's pool logs each failed attempt to reopen its floor of connections with one
  (its own task, retrying while the database is down); for the store's pools these
  attempts are told at debug level, one line each (:data:`QUIET_FLOOR`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ..._core.errors import StoreError, StoreUnavailableError
from ..._core.secrets import Scrubber

__all__ = ("QUIET_FLOOR", "ConflictError", "PgErrors", "passing", "where")

log = logging.getLogger("toolnexus_async.durable")


class ConflictError(StoreUnavailableError):
    """PostgreSQL rolled the transaction back to resolve a conflict with another (a
    deadlock, a serialization failure): nothing of it was committed, and each of its
    writes may simply go again."""


def where(dsn: str) -> str:
    """The server a DSN names, for messages: ``host:port/dbname``, or the socket directory
    and port of a Unix-socket DSN (``host=`` in the query, or a host that is a path); no
    user, no password, no other options."""
    try:
        parts = urlsplit(dsn)
        query = dict(parse_qsl(parts.query))
        host = unquote(parts.hostname or "") or query.get("host", "")
        port = parts.port or int(query.get("port", "") or 5432)
    except ValueError:
        return "postgresql database"
    dbname = parts.path if parts.path not in ("", "/") else "/" + query.get("dbname", "")
    if host.startswith("/"):
        return f"postgresql socket {host}/.s.PGSQL.{port} {dbname.lstrip('/') or '(default db)'}"
    return f"postgresql {host or 'localhost'}:{port}{dbname}"


# SQLSTATE classes and codes of a passing fault: the connection (08), too few resources
# (53: too many connections, disk full), the server stopping or restarting (57: admin or
# crash shutdown, cannot connect now, a statement cancelled by its timeout), a lock not
# had in time (55P03) and a transaction the server rolled back to resolve a conflict
# (40: serialization, deadlock). Retrying later is right for each; for every other error
# (a constraint, a syntax error, a bad value) it is not.
_PASSING_CLASSES = ("08", "53", "57", "40")
_PASSING_CODES = ("55P03",)


def passing(exc: BaseException, asyncpg: Any) -> bool:
    """Whether ``exc``, raised by asyncpg or the socket under it, is a passing fault."""
    if isinstance(exc, OSError | TimeoutError):
        return True
    if isinstance(exc, asyncpg.PostgresError):
        code = str(getattr(exc, "sqlstate", "") or "")
        return code[:2] in _PASSING_CLASSES or code in _PASSING_CODES
    # asyncpg's client-side errors: a connection closed under a call, or one left in a
    # state it cannot go on from by a server that ended it (InternalClientError "another
    # operation is in progress"); its DataError (a bad argument) is a bug, not a fault.
    if isinstance(exc, asyncpg.InternalClientError):
        return True
    return isinstance(exc, asyncpg.InterfaceError) and not isinstance(exc, ValueError)


def _secrets_of(dsn: str) -> tuple[str, ...]:
    """The DSN's password (in the userinfo or the query), as written and decoded, and the
    DSN itself. A user name is not a secret here: ``postgres`` would otherwise be
    scrubbed out of every ``postgresql`` in a message."""
    try:
        parts = urlsplit(dsn)
        password = parts.password
    except ValueError:
        return (dsn,)
    query = [v for k, v in parse_qsl(parts.query) if k == "password" and v]
    found = [p for p in (password, *query) if p]
    return tuple(dict.fromkeys((*found, *(unquote(p) for p in found), dsn)))


class PgErrors:
    """The failures of the database a DSN names, told as the store's errors.

    Args:
        dsn: the store's DSN (its secrets are scrubbed from every message).
        asyncpg: the asyncpg module (imported by the store, not here).
    """

    def __init__(self, dsn: str, asyncpg: Any) -> None:
        self.where = where(dsn)
        self._asyncpg = asyncpg
        self._scrub = Scrubber(_secrets_of(dsn))

    def failures(self) -> tuple[type[BaseException], ...]:
        """What a statement or a connection raises when the database fails it."""
        asyncpg = self._asyncpg
        return (
            OSError,
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
            asyncpg.InternalClientError,
            TimeoutError,
        )

    def passing(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a passing fault (see :func:`passing`)."""
        return passing(exc, self._asyncpg)

    def __call__(self, what: str, exc: BaseException) -> StoreError:
        """The error saying ``what`` of the database failed, by ``exc``."""
        text = self._scrub(f"{self.where}: {what}: {type(exc).__name__}: {exc}")
        if isinstance(exc, self._asyncpg.PostgresError) and str(
            getattr(exc, "sqlstate", "") or ""
        ).startswith("40"):
            return ConflictError(f"{text} (a conflict with another transaction)")
        if passing(exc, self._asyncpg):
            return StoreUnavailableError(f"{text} (the database is unavailable now)")
        return StoreError(text)


# What asyncpg's pool logs, with a traceback, each time its task fails to reopen a
# connection of its floor (``min_size``).
_FLOOR = "Failed to restore the pool connection floor; retrying"


class _QuietFloor(logging.Filter):
    """On asyncpg's pool logger: the store's pools' failed attempts to reopen their floor,
    told at debug level without their traceback; every other record as it was (another
    pool in the process is not the store's to quieten)."""

    def __init__(self) -> None:
        super().__init__()
        self._pools: dict[int, tuple[Any, str]] = {}  # id -> (pool, where), while open

    def add(self, pool: Any, where: str) -> None:
        if not self._pools:
            logging.getLogger("asyncpg.pool").addFilter(self)
        self._pools[id(pool)] = (pool, where)

    def discard(self, pool: Any) -> None:
        self._pools.pop(id(pool), None)
        if not self._pools:
            logging.getLogger("asyncpg.pool").removeFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != _FLOOR:
            return True
        try:
            task = asyncio.current_task()
        except RuntimeError:  # not on an event loop: not a pool's task
            return True
        for pool, where in self._pools.values():
            # The pool's task that reopens its floor (a private name: with another
            # asyncpg, nothing matches and the record goes out as it was).
            if task is not None and getattr(pool, "_maintenance_task", None) is task:
                cause = record.exc_info[1] if record.exc_info else None
                log.debug("%s: the pool cannot reopen a connection yet: %r", where, cause)
                return False
        return True


# The one filter, on asyncpg's pool logger while a store's pool is open.
QUIET_FLOOR = _QuietFloor()
