"""``client.ask``: a plain run without an id; with one, a conversation that is loaded,
continued and saved, one run at a time per id, in memory or in SQLite across clients.

Ordering between concurrent asks is forced with anyio events and
``wait_all_tasks_blocked``, never with sleeps.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import anyio
import pytest

from tests.conftest import FakeProvider, Seen, assert_no_leaks, openai_reply
from tests.shared import ApprovedPay
from toolnexus_async import (
    Answer,
    AssistantMessage,
    LlmClient,
    MemoryConversationStore,
    Message,
    SqliteConversationStore,
    SystemMessage,
    Toolkit,
    UsageError,
    UserMessage,
)
from toolnexus_async.testing import ScriptedModel, reply, tool_call

LIMIT = 5  # seconds; reached only when something hangs


def last_prompt(messages: list[Message]) -> str:
    return next(m.text for m in reversed(messages) if isinstance(m, UserMessage))


def echo_handler(provider: FakeProvider) -> None:
    """The provider answers every request with "re: <last user text>"."""

    def handler(body: dict[str, Any], seen: Seen) -> Any:
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        return openai_reply(f"re: {users[-1]}")

    provider.handler = handler


def sent(body: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(m["role"], m.get("content")) for m in body["messages"]]


class RecordingStore:
    """A conversation store (in memory) that records which methods were called."""

    def __init__(self) -> None:
        self.inner = MemoryConversationStore()
        self.ops: list[str] = []

    async def get(self, conversation_id: str) -> list[Message]:
        self.ops.append("get")
        return await self.inner.get(conversation_id)

    async def save(self, conversation_id: str, messages: Sequence[Message]) -> None:
        self.ops.append("save")
        await self.inner.save(conversation_id, messages)

    async def delete(self, conversation_id: str) -> bool:
        self.ops.append("delete")
        return await self.inner.delete(conversation_id)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def test_ask_without_an_id_is_a_plain_run() -> None:
    """No id: nothing is loaded or saved; each ask sees only its own prompt."""
    store = RecordingStore()
    model = ScriptedModel("one", "two")
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False) as tk,
            LlmClient.in_process(model, conversations=store) as client,
        ):
            first = await client.ask("hello", tk)
            second = await client.ask("again", tk)

    assert (first.status, first.text, second.text) == ("done", "one", "two")
    assert model.requests == [[UserMessage("hello")], [UserMessage("again")]]
    assert store.ops == []


async def test_ask_with_an_id_loads_continues_and_saves(provider: FakeProvider) -> None:
    """With an id the second ask's request carries the first exchange; other ids do not."""
    echo_handler(provider)
    store = MemoryConversationStore()
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False) as tk,
            provider.client(system_prompt="Be brief.", conversations=store) as client,
        ):
            await client.ask("my name is Ann", tk, conversation_id="ann")
            result = await client.ask("what is my name?", tk, conversation_id="ann")
            await client.ask("who am I?", tk, conversation_id="bob")
            stored = await store.get("ann")

    assert sent(provider.bodies[1]) == [
        ("system", "Be brief."),
        ("user", "my name is Ann"),
        ("assistant", "re: my name is Ann"),
        ("user", "what is my name?"),
    ]
    assert sent(provider.bodies[2]) == [("system", "Be brief."), ("user", "who am I?")]
    assert stored == [
        SystemMessage("Be brief."),
        UserMessage("my name is Ann"),
        AssistantMessage("re: my name is Ann"),
        UserMessage("what is my name?"),
        AssistantMessage("re: what is my name?"),
    ]
    assert list(result.messages) == stored
    assert_no_leaks()


async def test_concurrent_asks_on_one_id_are_serialised_in_arrival_order() -> None:
    """Asks on one id take turns: a later ask's model request starts only after the earlier
    run finished, and it sees the earlier exchange."""
    log: list[str] = []
    seen: dict[str, list[Message]] = {}
    first_started = anyio.Event()
    release_first = anyio.Event()

    async def generate(messages: list[Message], tools: list[Any]) -> str:
        prompt = last_prompt(messages)
        seen[prompt] = messages
        log.append(f"start {prompt}")
        if prompt == "first":
            first_started.set()
            await release_first.wait()
        log.append(f"end {prompt}")
        return f"re: {prompt}"

    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False) as tk,
            LlmClient.in_process(generate) as client,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(functools.partial(client.ask, "first", tk, conversation_id="shared"))
            await first_started.wait()
            tg.start_soon(functools.partial(client.ask, "second", tk, conversation_id="shared"))
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(functools.partial(client.ask, "third", tk, conversation_id="shared"))
            await anyio.wait_all_tasks_blocked()
            assert log == ["start first"], "a second ask on the id ran while the first did"
            release_first.set()

    assert log == [
        "start first",
        "end first",
        "start second",
        "end second",
        "start third",
        "end third",
    ]
    assert [last_prompt(seen["second"][:i]) for i in (1, 3)] == ["first", "second"]
    assert [m for m in seen["third"] if isinstance(m, UserMessage)] == [
        UserMessage("first"),
        UserMessage("second"),
        UserMessage("third"),
    ]
    assert_no_leaks()


async def test_asks_on_different_ids_run_concurrently() -> None:
    """Asks on different ids overlap: each model request waits for the other to start."""
    started = {"a": anyio.Event(), "b": anyio.Event()}

    async def generate(messages: list[Message], tools: list[Any]) -> str:
        me = last_prompt(messages)
        other = "b" if me == "a" else "a"
        started[me].set()
        await started[other].wait()  # deadlocks (then fail_after) if the asks take turns
        return f"re: {me}"

    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False) as tk,
            LlmClient.in_process(generate) as client,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(functools.partial(client.ask, "a", tk, conversation_id="id-a"))
            tg.start_soon(functools.partial(client.ask, "b", tk, conversation_id="id-b"))
    assert_no_leaks()


async def test_sqlite_conversations_persist_across_clients(
    provider: FakeProvider, tmp_path: Path
) -> None:
    """A conversation saved by one client's SQLite store is continued by another client's."""
    echo_handler(provider)
    path = tmp_path / "conversations.db"
    with anyio.fail_after(LIMIT):
        async with Toolkit.create(builtins=False) as tk:
            async with (
                SqliteConversationStore(path) as store,
                provider.client(conversations=store) as one,
            ):
                await one.ask("remember 42", tk, conversation_id="c-1")
            async with (
                SqliteConversationStore(path) as store,
                provider.client(conversations=store) as two,
            ):
                result = await two.ask("which number?", tk, conversation_id="c-1")
                stored = await store.get("c-1")

    assert sent(provider.bodies[1]) == [
        ("user", "remember 42"),
        ("assistant", "re: remember 42"),
        ("user", "which number?"),
    ]
    assert result.text == "re: which number?"
    assert stored == list(result.messages) and len(stored) == 4
    assert_no_leaks()


async def test_an_ask_on_a_halted_conversation_is_refused_without_asking_the_model() -> None:
    """A conversation saved halted (a call without a result) cannot simply be continued."""
    model = ScriptedModel(reply(tool_call("pay", id="c1")), "never")
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=[ApprovedPay()]) as tk,
            LlmClient.in_process(model) as client,
        ):
            halted = await client.ask("pay", tk, conversation_id="c")
            assert halted.status == "pending"
            with pytest.raises(UsageError):
                await client.ask("and now?", tk, conversation_id="c")
    assert len(model.requests) == 1


async def test_a_failed_ask_saves_nothing_and_frees_the_id() -> None:
    """A run that raises leaves the stored conversation as it was; the id is usable again."""
    calls = 0

    async def flaky(messages: list[Message], tools: list[Any]) -> Any:
        nonlocal calls
        calls += 1
        return 42 if calls == 1 else f"re: {last_prompt(messages)}"  # 42 is no reply

    store = MemoryConversationStore()
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False) as tk,
            LlmClient.in_process(flaky, conversations=store) as client,
        ):
            with pytest.raises(Exception, match="returned int"):
                await client.ask("first", tk, conversation_id="c")
            assert await store.get("c") == []
            result = await client.ask("second", tk, conversation_id="c")

    assert list(result.messages) == [UserMessage("second"), AssistantMessage("re: second")]


async def test_a_halted_ask_once_resumed_lets_the_conversation_go_on() -> None:
    """ "Resume that run first" works: after client.resume, the next ask continues the
    conversation from the resumed transcript (with the default, private store)."""

    model = ScriptedModel(reply(tool_call("pay", id="c1")), "done paying", "you paid")
    with anyio.fail_after(LIMIT):
        async with (
            Toolkit.create(builtins=False, extra_tools=[ApprovedPay()]) as tk,
            LlmClient.in_process(model) as client,
        ):
            halted = await client.ask("pay", tk, conversation_id="c")
            assert halted.pending is not None
            resumed = await client.resume(halted, tk, answers=Answer(halted.pending.id, True))
            assert resumed.status == "done"
            result = await client.ask("did I pay?", tk, conversation_id="c")

    assert result.text == "you paid"
    assert model.requests[2] == [*resumed.messages, UserMessage("did I pay?")]
