"""How :class:`PostgresRunStore` tells a failure of its database: which server, which kind.

Rules of this module:

- The DSN may hold a password: it is never shown. Errors name the database as
  ``host:port/dbname`` only (:func:`where`), and asyncpg's own messages are scrubbed of
  the DSN's secrets before they are shown.
- A passing fault (:func:`passing`: the connection, the server stopping, too few
  resources, a lock or a conflict) is a :class:`StoreUnavailableError`, to be retried
  later; every other failure of the database is a plain :class:`StoreError`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ..._core.errors import StoreError, StoreUnavailableError
from ..._core.secrets import Scrubber

__all__ = ("ConflictError", "PgErrors", "passing", "where")


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
