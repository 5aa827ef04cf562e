"""Conversation stores and locks: the contract both stores keep, SQLite's file rules,
and per-conversation locks that serialise holders and leave nothing behind."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from tests.conftest import assert_no_leaks
from tests.shared import raw_sql
from toolnexus_async._core.errors import PayloadError, StoreError, UsageError
from toolnexus_async._core.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolReturn,
    UserMessage,
)
from toolnexus_async._engine.conversations import (
    ConversationLocks,
    ConversationStore,
    MemoryConversationStore,
    SqliteConversationStore,
)
from toolnexus_async.durable import SqliteRunStore

StoreFactory = Callable[[], ConversationStore]

TRANSCRIPT: list[Message] = [
    SystemMessage("Be brief."),
    UserMessage("Pay INV-1 and tell Ann — ünïcødé 🧾"),
    AssistantMessage(
        "Looking it up.",
        (
            ToolCall("c1", "lookup", {"invoice": "INV-1", "deep": {"list": [1, 2.5, None]}}),
            ToolCall("c2", "pay", {}, invalid_arguments='{"amount": 3'),
        ),
    ),
    ToolReturn("c1", "lookup", "INV-1: 30 EUR"),
    ToolReturn("c2", "pay", "arguments are not JSON", is_error=True),
    AssistantMessage(None, (ToolCall("c3", "notify", {"who": "Ann"}),)),
    ToolReturn("c3", "notify", "notified Ann"),
    AssistantMessage("Done."),
]


@pytest.fixture(params=["memory", "sqlite"])
async def make_store(request: Any, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    """A factory of stores of one kind (SQLite: all on one file); all closed afterwards."""
    made: list[ConversationStore] = []

    def make() -> ConversationStore:
        store: ConversationStore
        if request.param == "sqlite":
            store = SqliteConversationStore(tmp_path / "conversations.db")
        else:
            store = MemoryConversationStore()
        made.append(store)
        return store

    yield make
    for store in made:
        await store.aclose()


@pytest.fixture
def store(make_store: StoreFactory) -> ConversationStore:
    """One store of each kind (the suite runs once per kind)."""
    return make_store()


# The contract, for both stores.


async def test_every_message_kind_round_trips_as_fresh_objects(store):
    """System, user, assistant text and tool calls (incl. invalid args), tool results."""
    await store.save("conv-1", TRANSCRIPT)

    first, second = await store.get("conv-1"), await store.get("conv-1")

    assert first == TRANSCRIPT and second == TRANSCRIPT
    assert first is not second and first[2] is not TRANSCRIPT[2]
    first[2].tool_calls[0].arguments["invoice"] = "changed"  # a loaded copy is the caller's own
    assert await store.get("conv-1") == TRANSCRIPT
    assert isinstance(store, ConversationStore)


async def test_save_replaces_the_whole_transcript(store):
    """A shorter save after a longer one leaves only the shorter transcript."""
    await store.save("conv", TRANSCRIPT)
    await store.save("conv", [UserMessage("again")])

    assert await store.get("conv") == [UserMessage("again")]
    await store.save("conv", [])
    assert await store.get("conv") == []


async def test_an_unknown_id_is_an_empty_transcript(store):
    """Never saved: [], not an error; and reading it stores nothing."""
    assert await store.get("never-saved") == []
    assert await store.delete("never-saved") is False


async def test_delete_forgets_one_conversation_only(store):
    """delete says whether there was one; the other conversation is untouched."""
    await store.save("a", TRANSCRIPT)
    await store.save("b", [UserMessage("b")])

    assert await store.delete("a") is True
    assert await store.get("a") == []
    assert await store.delete("a") is False
    assert await store.get("b") == [UserMessage("b")]


@pytest.mark.parametrize("bad", ["", "x" * 257, 123, None])
async def test_a_bad_conversation_id_is_a_usage_error(store, bad):
    """Empty, over 256 characters, or not a string: refused by get, save and delete."""
    with pytest.raises(UsageError, match="conversation id"):
        await store.get(bad)
    with pytest.raises(UsageError, match="conversation id"):
        await store.save(bad, TRANSCRIPT)
    with pytest.raises(UsageError, match="conversation id"):
        await store.delete(bad)


async def test_the_longest_allowed_id_works(store):
    """256 characters is within the limit, and ids differing at the end stay apart."""
    long_a, long_b = "x" * 255 + "a", "x" * 255 + "b"
    await store.save(long_a, [UserMessage("a")])
    await store.save(long_b, [UserMessage("b")])

    assert await store.get(long_a) == [UserMessage("a")]
    assert await store.get(long_b) == [UserMessage("b")]


async def test_a_transcript_that_is_not_json_is_refused_and_the_old_one_kept(store):
    """A non-JSON tool argument, or an object that is no message: PayloadError, no change."""
    await store.save("conv", TRANSCRIPT)
    odd = AssistantMessage(None, (ToolCall("c9", "x", {"when": object()}),))

    with pytest.raises(PayloadError, match="'conv'"):
        await store.save("conv", [UserMessage("hi"), odd])
    with pytest.raises(PayloadError, match="'conv'"):
        await store.save("conv", ["not a message"])
    assert await store.get("conv") == TRANSCRIPT


async def test_concurrent_saves_of_different_conversations_all_land(store):
    """Many tasks on one store at once: every conversation is stored whole."""
    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(store.save, f"c{i}", [UserMessage(str(i)), AssistantMessage(str(i))])

    for i in range(20):
        assert await store.get(f"c{i}") == [UserMessage(str(i)), AssistantMessage(str(i))]


async def test_a_closed_store_refuses_work(make_store):
    """After leaving async with, every operation is a usage error; aclose is idempotent."""
    async with make_store() as store:
        await store.save("conv", TRANSCRIPT)

    for call in (store.get("conv"), store.save("conv", []), store.delete("conv")):
        with pytest.raises(UsageError, match="closed"):
            await call
    with pytest.raises(UsageError, match="conversation store is closed"):
        async with store:
            pass
    await store.aclose()
    assert_no_leaks()


# SQLite: the file, its rows, other programs.


async def test_conversations_outlive_the_store_and_aclose_ends_the_thread(tmp_path: Path):
    """WAL file; a transcript saved by one store is read by a later one; no thread is left."""
    path = tmp_path / "conversations.db"
    before = set(threading.enumerate())
    store = SqliteConversationStore(path)
    await store.save("conv", TRANSCRIPT)
    started = set(threading.enumerate()) - before
    assert started, "the store should have started its connection thread"
    await store.aclose()
    for thread in started:
        thread.join(timeout=5)
        assert not thread.is_alive()
    assert raw_sql(path, "PRAGMA journal_mode") == [("wal",)]

    async with SqliteConversationStore(path) as reopened:
        assert await reopened.get("conv") == TRANSCRIPT
        assert await reopened.delete("conv") is True
    async with SqliteConversationStore(path) as again:
        assert await again.get("conv") == []
    assert_no_leaks()


async def test_two_stores_on_one_file_see_each_others_saves(tmp_path: Path):
    """Two connections (as two processes would hold): a save by one is read by the other."""
    path = tmp_path / "conversations.db"
    async with SqliteConversationStore(path) as one, SqliteConversationStore(path) as two:
        await one.save("conv", TRANSCRIPT)
        assert await two.get("conv") == TRANSCRIPT
        await two.save("conv", [UserMessage("last")])
        assert await one.get("conv") == [UserMessage("last")]
    assert_no_leaks()


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"version": 9, "messages": []}), "version 9"),
        (json.dumps({"version": 1, "messages": [{"role": "robot"}]}), "unknown role"),
        (42, "JSON object"),
    ],
)
async def test_a_corrupt_row_fails_alone_naming_its_conversation(tmp_path: Path, body, why):
    """Bad JSON, a newer version, an unknown role, a number: StoreError naming the id."""
    path = tmp_path / "conversations.db"
    async with SqliteConversationStore(path) as store:
        await store.save("good", TRANSCRIPT)
        raw_sql(
            path,
            "INSERT INTO conversation_transcripts (conversation_id, updated, body)"
            " VALUES (?, 0, ?)",
            "broken",
            body,
        )

        for _ in range(2):  # the row stays for a human to inspect
            with pytest.raises(StoreError, match=rf"'broken'.*{why}"):
                await store.get("broken")
        assert await store.get("good") == TRANSCRIPT
        await store.save("broken", [UserMessage("fixed")])  # a save overwrites it
        assert await store.get("broken") == [UserMessage("fixed")]
    assert_no_leaks()


@pytest.mark.parametrize(
    "kind", ["newer schema", "other application", "other app id", "run store", "not a database"]
)
async def test_a_file_not_ours_or_newer_is_refused_and_not_touched(tmp_path: Path, kind):
    """A newer schema, another program's or the run store's file, not SQLite: StoreError."""
    path = tmp_path / "conversations.db"
    if kind == "newer schema":
        async with SqliteConversationStore(path) as store:
            await store.save("conv", TRANSCRIPT)
        raw_sql(path, "UPDATE conversation_meta SET value = 2")
    elif kind == "other application":
        raw_sql(path, "CREATE TABLE notes (text TEXT)")
    elif kind == "other app id":
        raw_sql(path, "PRAGMA application_id = 7")
    elif kind == "run store":
        async with SqliteRunStore(path) as runs:
            await runs.requests()
    else:
        path.write_bytes(b"definitely not sqlite " * 100)
    before = path.read_bytes()

    message = {
        "newer schema": r"version 2.*newer",
        "other application": "another application",
        "other app id": r"another application \(id 7\)",
        "run store": "run store's file",
        "not a database": "cannot be opened",
    }[kind]
    with pytest.raises(StoreError, match=message):
        async with SqliteConversationStore(path):
            pass
    lazy = SqliteConversationStore(path)
    with pytest.raises(StoreError):
        await lazy.get("conv")
    await lazy.aclose()
    assert path.read_bytes() == before
    assert_no_leaks()


async def test_the_run_store_refuses_a_conversation_file(tmp_path: Path):
    """The two stores do not share a file: the run store is told it is not its own."""
    from toolnexus_async._engine.conversations import _RUN_STORE_APPLICATION_ID
    from toolnexus_async.durable.sqlite._store import APPLICATION_ID

    assert _RUN_STORE_APPLICATION_ID == APPLICATION_ID  # the copied stamp has not drifted
    path = tmp_path / "conversations.db"
    async with SqliteConversationStore(path) as store:
        await store.save("conv", TRANSCRIPT)

    with pytest.raises(StoreError, match="another application"):
        async with SqliteRunStore(path):
            pass
    async with SqliteConversationStore(path) as store:
        assert await store.get("conv") == TRANSCRIPT
    assert_no_leaks()


# ConversationLocks.


async def test_two_holders_of_one_id_take_turns():
    """The second holder cannot enter while the first is inside; it enters once it leaves."""
    locks = ConversationLocks()
    log: list[str] = []
    first_inside, release_first = anyio.Event(), anyio.Event()

    async def first() -> None:
        async with locks.hold("conv"):
            log.append("first in")
            first_inside.set()
            await release_first.wait()
            log.append("first out")

    async def second() -> None:
        async with locks.hold("conv"):
            log.append("second in")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            await first_inside.wait()
            tg.start_soon(second)
            await wait_all_tasks_blocked()  # second is now parked on the lock, not inside

            assert log == ["first in"]
            assert len(locks) == 1
            release_first.set()

    assert log == ["first in", "first out", "second in"]
    assert len(locks) == 0


async def test_different_ids_do_not_block_each_other():
    """While one id is held, another id is entered at once."""
    locks = ConversationLocks()
    release = anyio.Event()
    inside_a = anyio.Event()

    async def hold_a() -> None:
        async with locks.hold("a"):
            inside_a.set()
            await release.wait()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_a)
            await inside_a.wait()
            async with locks.hold("b"):
                assert len(locks) == 2
            assert len(locks) == 1
            release.set()

    assert len(locks) == 0


async def test_the_lock_map_is_empty_after_errors_and_cancelled_waiters():
    """A body that raises, and a waiter cancelled in line, leave no lock behind."""
    locks = ConversationLocks()
    with pytest.raises(RuntimeError):
        async with locks.hold("conv"):
            raise RuntimeError("boom")
    assert len(locks) == 0

    inside, release = anyio.Event(), anyio.Event()
    entered: list[str] = []

    async def holder() -> None:
        async with locks.hold("conv"):
            inside.set()
            await release.wait()

    async def waiter(scope: anyio.CancelScope) -> None:
        with scope:
            async with locks.hold("conv"):
                entered.append("waiter")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(holder)
            await inside.wait()
            scope = anyio.CancelScope()
            tg.start_soon(waiter, scope)
            await wait_all_tasks_blocked()
            scope.cancel()
            await wait_all_tasks_blocked()
            assert len(locks) == 1  # the holder's, still held
            release.set()

    assert entered == []
    assert len(locks) == 0
    async with locks.hold("conv"):  # and the id can be held again
        assert len(locks) == 1
    assert len(locks) == 0


@pytest.mark.parametrize("bad", ["", "x" * 257, 5])
async def test_locks_refuse_a_bad_id(bad):
    """The same id rule as the stores, checked before any lock is made."""
    locks = ConversationLocks()
    with pytest.raises(UsageError, match="conversation id"):
        async with locks.hold(bad):
            pass
    assert len(locks) == 0
