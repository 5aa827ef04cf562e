"""toolnexus_async, as overhead.py runs it: ``LlmClient`` + a ``Toolkit`` of two ``define_tool``
tools, ``await client.run(prompt, toolkit)``, with no cap on the connection pool
(``AiohttpTransport(max_connections=None)``, as the peers' HTTP clients get too).

Parking: the client's ``wait_for`` is an ``Inbox`` and ``hooks=Hooks(before_tool=
require_approval(["add"]))`` suspends ``add`` until it is approved: the run stays a
suspended coroutine in this process; waking is ``inbox.answer(Answer(id, True))``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import _harness
from _harness import clock
from _project import _mock, overhead

from toolnexus_async import (
    AiohttpTransport,
    Answer,
    Hooks,
    Inbox,
    LlmClient,
    Toolkit,
    define_tool,
    require_approval,
)


class ToolnexusAsync:
    name = "toolnexus_async"
    packages: tuple[str, ...] = ("toolnexus-async", "aiohttp", "anyio")
    parks = True
    mechanism = "Inbox (wait_for) + require_approval hook: the run is a suspended coroutine"

    async def start(self, base_url: str) -> None:
        self.client = LlmClient(
            base_url,
            style="openai",
            model=_mock.MODEL,
            api_key=_mock.API_KEY,
            transport=AiohttpTransport(max_connections=None),
        )
        self.run = overhead.toolnexus_runner(self.client, overhead.make_toolkit())
        self.inbox = Inbox()
        self.continued: dict[int, float] = {}

        async def add(a: int, b: int) -> str:
            """Add two integers.

            Args:
                a: the first addend.
                b: the second addend.
            """
            # Only an approved call gets here, and wakes come one at a time: the run
            # being woken is the one that continues.
            self.continued[self.current] = clock()
            return str(a + b)

        self.current = -1
        self.gated = LlmClient(
            base_url,
            style="openai",
            model=_mock.MODEL,
            api_key=_mock.API_KEY,
            wait_for=self.inbox,
            hooks=Hooks(before_tool=require_approval(["add"])),
            transport=AiohttpTransport(max_connections=None),
        )
        self.gated_toolkit = Toolkit.create(
            builtins=False,
            extra_tools=[define_tool(overhead.get_weather), define_tool(add)],
        )
        self.tg = asyncio.TaskGroup()
        await self.tg.__aenter__()
        self.tasks: set[asyncio.Task[None]] = set()
        # A parked run's number and the future its park() awaits, by the run's id: what
        # watch() needs, without reading the number back out of the id.
        self.parked: dict[str, tuple[int, asyncio.Future[None]]] = {}
        self.request_of: dict[int, str] = {}
        self.finished: dict[int, asyncio.Future[str]] = {}
        self.spawn(self.watch())

    async def watch(self) -> None:
        async for request in self.inbox.requests():
            run_id = self.inbox.run_of(request.id)
            entry = None if run_id is None else self.parked.pop(run_id, None)
            if entry is not None:
                n, parked = entry
                self.request_of[n] = request.id
                parked.set_result(None)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self.tg.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def close(self) -> None:
        for task in self.tasks:  # the runs still parked, and watch()
            task.cancel()
        await self.tg.__aexit__(None, None, None)
        await self.gated.aclose()
        await self.client.aclose()

    async def parked_run(self, n: int, run_id: str) -> None:
        result = await self.gated.run(overhead.PROMPT, self.gated_toolkit, run_id=run_id)
        text = result.text if result.status == "done" else f"status {result.status}"
        self.finished.pop(n).set_result(text)

    async def run_once(self) -> str:
        return await self.run()

    async def park(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        run_id = f"run-{n}"
        parked = loop.create_future()
        self.parked[run_id] = (n, parked)
        self.finished[n] = loop.create_future()
        self.spawn(self.parked_run(n, run_id))
        await parked

    async def wake(self, n: int) -> str:
        self.current = n
        finished = self.finished[n]
        await self.inbox.answer(Answer(self.request_of.pop(n), True))
        return await finished

    def continued_at(self, n: int) -> float:
        return self.continued.pop(n)


if __name__ == "__main__":
    _harness.main(ToolnexusAsync())
