"""Conversation stores: a transcript kept under a conversation id between runs.

Rules of this module:

- A store keeps each conversation's versioned JSON text (:func:`messages_to_json`), never
  the objects: every ``get`` builds fresh messages, and a transcript that cannot become
  JSON is refused at ``save`` (:class:`PayloadError`), with the stored one left as it was.
- ``save`` replaces the whole transcript; ``get`` of an id never saved (or deleted) is ``[]``.
- A conversation id is a non-empty string of at most 256 characters; anything else is a
  :class:`UsageError`, whichever store (or :class:`ConversationLocks`) is asked.
- A row that cannot be read back is that conversation's problem: ``get`` raises
  :class:`StoreError` naming it, and every other conversation still loads.
- :class:`SqliteConversationStore` keeps one file of its own, in WAL mode, stamped with its
  own application id and a schema version under its own key; a file that is not ours, or
  is from a newer release, is refused with :class:`StoreError` and never written to. It is
  not shared with :class:`~toolnexus_async.durable.SqliteRunStore`: that store takes any
  file bearing its application id and schema version to hold its own tables, so a file
  stamped first by this store would break it. Each store refuses the other's file loudly.
  Its connection follows :class:`~toolnexus_async._io.sqlite_file.SqliteFile`'s rules; every
  write is one statement (atomic under autocommit), sent through its shielded ``_write``.
- A store does not serialise a read-run-save cycle; :class:`ConversationLocks` does, per
  conversation id, within one process and one event loop.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

import anyio

from .._core.closing import FlagClosing
from .._core.errors import PayloadError, StoreError, UsageError
from .._core.messages import Message, messages_from_json, messages_to_json
from .._io.sqlite_file import Conn, SqliteFile, rows

if TYPE_CHECKING:
    from .._core.results import RunResult

__all__ = (
    "ConversationRuns",
    "ConversationStore",
    "MemoryConversationStore",
    "SqliteConversationStore",
    "ConversationLocks",
)

log = logging.getLogger("toolnexus_async.conversations")

MAX_CONVERSATION_ID = 256


def check_conversation_id(conversation_id: object) -> str:
    """``conversation_id`` if it is a non-empty string of at most 256 characters.

    Raises:
        UsageError: it is not.
    """
    if not isinstance(conversation_id, str):
        raise UsageError(
            f"a conversation id must be a string, got {type(conversation_id).__name__}"
        )
    if not conversation_id:
        raise UsageError("a conversation id must not be empty")
    if len(conversation_id) > MAX_CONVERSATION_ID:
        raise UsageError(
            f"a conversation id must be at most {MAX_CONVERSATION_ID} characters,"
            f" got {len(conversation_id)}"
        )
    return conversation_id


def encode_transcript(conversation_id: str, messages: Iterable[Message]) -> str:
    """The JSON text a store keeps for a conversation.

    Raises:
        PayloadError: a message is not a transcript message, or holds a non-JSON value.
    """
    try:
        return json.dumps(messages_to_json(messages), ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise PayloadError(
            f"conversation {conversation_id!r} cannot be stored as JSON: {exc}"
        ) from None


def decode_transcript(conversation_id: str, text: object) -> list[Message]:
    """Rebuild a stored transcript.

    Raises:
        StoreError: the text is not a readable transcript; the message names the
            conversation.
    """
    where = f"stored conversation {conversation_id!r}"
    try:
        return messages_from_json(text if isinstance(text, str | bytes) else str(text))
    except PayloadError as exc:
        raise StoreError(f"{where} cannot be read: {exc}") from None
    except Exception as exc:  # a foreign row may trip the parser in ways it did not foresee
        raise StoreError(f"{where} cannot be read: {type(exc).__name__}: {exc}") from None


@runtime_checkable
class ConversationStore(Protocol):
    """Where a conversation's transcript waits between runs, possibly across processes.

    Every store is an async context manager; ``aclose()`` does the same as leaving it.
    """

    async def get(self, conversation_id: str) -> list[Message]:
        """The stored transcript, as fresh objects; ``[]`` for an id never saved.

        Raises:
            UsageError: the id is not a non-empty string of at most 256 characters.
            StoreError: the stored row is corrupt or foreign; the message names it.
        """
        ...

    async def save(self, conversation_id: str, messages: Sequence[Message]) -> None:
        """Replace the stored transcript with ``messages``.

        Raises:
            UsageError: a bad id.
            PayloadError: the transcript cannot be written as JSON; nothing is changed.
        """
        ...

    async def delete(self, conversation_id: str) -> bool:
        """Forget the conversation; ``True`` if there was one to forget.

        Raises:
            UsageError: a bad id.
        """
        ...

    async def aclose(self) -> None:
        """Release what the store holds; idempotent."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class MemoryConversationStore(FlagClosing):
    """A :class:`ConversationStore` in this process's memory; the default.

    It keeps each transcript's JSON text, so it behaves like the durable store: every
    ``get`` is a fresh list of fresh messages, and a transcript that is not JSON fails at
    ``save``. Its methods never await, so each one is atomic on its event loop.
    """

    _kind = "conversation store"

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}

    def __len__(self) -> int:
        """The number of stored conversations."""
        return len(self._texts)

    async def get(self, conversation_id: str) -> list[Message]:
        self._check_open()
        check_conversation_id(conversation_id)
        text = self._texts.get(conversation_id)
        return [] if text is None else decode_transcript(conversation_id, text)

    async def save(self, conversation_id: str, messages: Sequence[Message]) -> None:
        self._check_open()
        check_conversation_id(conversation_id)
        self._texts[conversation_id] = encode_transcript(conversation_id, messages)

    async def delete(self, conversation_id: str) -> bool:
        self._check_open()
        check_conversation_id(conversation_id)
        return self._texts.pop(conversation_id, None) is not None


# "TnxC": not the run store's "TnxA" (see the module docstring for why they do not share).
APPLICATION_ID = 0x546E7843
# The run store's stamp, so its file is refused with a helpful message. Written out, not
# imported: durable/ imports the client, which will import this module (a test pins it).
_RUN_STORE_APPLICATION_ID = 0x546E7841
SCHEMA_VERSION = 1
VERSION_KEY = "conversation_schema_version"

_SCHEMA = (
    """CREATE TABLE conversation_meta (
        key TEXT PRIMARY KEY,
        value INTEGER NOT NULL)""",
    """CREATE TABLE conversation_transcripts (
        conversation_id TEXT PRIMARY KEY,
        updated REAL NOT NULL,
        body TEXT NOT NULL)""",
)


class SqliteConversationStore(SqliteFile):
    """A :class:`ConversationStore` in one SQLite file of its own.

    The file is opened on first use, or by ``async with``; :meth:`aclose` closes it (and
    the connection's worker thread). Several stores, in one process or many, may share one
    file; the last ``save`` of a conversation wins.

    Args:
        path: the database file (created if missing). Not a run store's file.
        timeout: seconds to wait for another process's write lock before giving up.
    """

    _label = "conversation store"
    _log = log

    def __repr__(self) -> str:
        return f"SqliteConversationStore({self.path!r})"

    async def get(self, conversation_id: str) -> list[Message]:
        check_conversation_id(conversation_id)

        async def op(conn: Conn) -> list[Message]:
            found = await rows(
                conn,
                "SELECT body FROM conversation_transcripts WHERE conversation_id = ?",
                (conversation_id,),
            )
            return decode_transcript(conversation_id, found[0][0]) if found else []

        return await self._locked(op)

    async def save(self, conversation_id: str, messages: Sequence[Message]) -> None:
        check_conversation_id(conversation_id)
        text = encode_transcript(conversation_id, messages)

        async def op(conn: Conn) -> None:
            await conn.execute(
                "INSERT OR REPLACE INTO conversation_transcripts"
                " (conversation_id, updated, body) VALUES (?, ?, ?)",
                (conversation_id, time.time(), text),
            )

        await self._write(op)

    async def delete(self, conversation_id: str) -> bool:
        check_conversation_id(conversation_id)

        async def op(conn: Conn) -> bool:
            async with conn.execute(
                "DELETE FROM conversation_transcripts WHERE conversation_id = ?",
                (conversation_id,),
            ) as cursor:
                return cursor.rowcount > 0

        return await self._write(op)

    async def _check_schema(self, conn: Conn) -> None:
        app = (await rows(conn, "PRAGMA application_id"))[0][0]
        if app == 0:
            if await rows(conn, "SELECT name FROM sqlite_master LIMIT 1"):
                raise StoreError(f"{self.path} is a SQLite file of another application")
            for statement in _SCHEMA:
                await conn.execute(statement)
            await conn.execute(
                "INSERT INTO conversation_meta (key, value) VALUES (?, ?)",
                (VERSION_KEY, SCHEMA_VERSION),
            )
            await conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            return
        if app == _RUN_STORE_APPLICATION_ID:
            raise StoreError(
                f"{self.path} is a run store's file; keep conversations in a file of their own"
            )
        if app != APPLICATION_ID:
            raise StoreError(f"{self.path} is a SQLite file of another application (id {app})")
        found = await rows(
            conn, "SELECT value FROM conversation_meta WHERE key = ?", (VERSION_KEY,)
        )
        version = found[0][0] if found else None
        if version != SCHEMA_VERSION:
            newer = (
                "a newer release"
                if isinstance(version, int) and version > SCHEMA_VERSION
                else "an unknown release"
            )
            raise StoreError(
                f"conversation store {self.path} has schema version {version}, from {newer};"
                f" this release reads version {SCHEMA_VERSION}"
            )


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = anyio.Lock()
        self.users = 0  # the holder and every waiter


class ConversationLocks:
    """One lock per conversation id, so that runs on one conversation take turns.

    ``async with locks.hold(conversation_id): ...`` waits until no other task holds that
    id, then holds it for the block. Locks are made on demand and dropped as soon as no
    task holds or waits for them, so the map never outgrows the conversations in use.
    A cancelled waiter leaves nothing behind. Use it on one event loop.
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        """How many conversation ids are held or waited for right now."""
        return len(self._entries)

    @asynccontextmanager
    async def hold(self, conversation_id: str) -> AsyncIterator[None]:
        """Hold ``conversation_id`` for the block; other holders of it wait their turn.

        Raises:
            UsageError: a bad id.
        """
        check_conversation_id(conversation_id)
        entry = self._entries.get(conversation_id)
        if entry is None:
            entry = self._entries[conversation_id] = _Entry()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[conversation_id]


class ConversationRuns:
    """What ``client.ask`` keeps: the store, a lock per conversation, and which halted run
    belongs to which conversation (so that resuming it saves the conversation back)."""

    def __init__(self, store: ConversationStore) -> None:
        self.store = store
        self._locks = ConversationLocks()
        self._halted: dict[str, str] = {}

    async def ask(
        self,
        run: Callable[..., Awaitable[RunResult]],
        prompt: str,
        toolkit: Any,
        conversation_id: str,
    ) -> RunResult:
        """Load, run (with ``run(prompt, toolkit, history=...)``) and save, one at a time."""
        check_conversation_id(conversation_id)
        async with self._locks.hold(conversation_id):
            history = await self.store.get(conversation_id)
            result = await run(prompt, toolkit, history=history)
            await self.store.save(conversation_id, result.messages)
        if result.status == "pending":
            self._halted[result.run_id] = conversation_id
        return result

    async def resumed(self, run_id: str, result: RunResult) -> None:
        """A run resumed on the client: save its conversation if it came from ``ask``."""
        conversation_id = self._halted.pop(run_id, None)
        if conversation_id is None:
            return
        async with self._locks.hold(conversation_id):
            await self.store.save(conversation_id, result.messages)
        if result.status == "pending":
            self._halted[result.run_id] = conversation_id
