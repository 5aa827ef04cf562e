"""The floor: overhead.py's hand-written raw-aiohttp run (``floor_runner``), no framework.

Parking: a task per run awaits a bare ``asyncio.Future`` (the approval) before it calls
``add``, holding what it needs to go on (its messages and the reply) in its frame; waking
sets the future's result.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any

import _harness
from _harness import clock
from _project import _mock, overhead


class Floor:
    name = "floor"
    packages: tuple[str, ...] = ("aiohttp",)
    parks = True
    mechanism = "a task per run awaiting a bare asyncio.Future in a dict"

    async def start(self, base_url: str) -> None:
        self.session = overhead.floor_session()
        self.url = base_url + "/chat/completions"
        self.run = overhead.floor_runner(self.session, base_url)
        self.tg = asyncio.TaskGroup()
        await self.tg.__aenter__()
        self.tasks: set[asyncio.Task[None]] = set()
        self.approvals: dict[int, asyncio.Future[bool]] = {}
        self.parked: dict[int, asyncio.Future[None]] = {}
        self.finished: dict[int, asyncio.Future[str]] = {}
        self.continued: dict[int, float] = {}

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self.tg.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def close(self) -> None:
        for task in self.tasks:  # the runs still parked
            task.cancel()
        await self.tg.__aexit__(None, None, None)
        await self.session.close()

    async def post(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"model": _mock.MODEL, "messages": messages, "tools": overhead.FLOOR_TOOLS}
        headers = {
            "Authorization": f"Bearer {_mock.API_KEY}",
            "Content-Type": "application/json",
        }
        data = json.dumps(body, separators=(",", ":")).encode()
        async with self.session.post(self.url, data=data, headers=headers) as response:
            raw = await response.read()
            if response.status != 200:
                raise RuntimeError(f"floor: HTTP {response.status}")
        message: dict[str, Any] = json.loads(raw)["choices"][0]["message"]
        return message

    async def parked_run(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        messages: list[dict[str, Any]] = [{"role": "user", "content": overhead.PROMPT}]
        assistant = await self.post(messages)
        messages.append(assistant)
        for call in assistant["tool_calls"]:
            function = call["function"]
            args = json.loads(function["arguments"])
            if function["name"] == "add":
                approval = self.approvals[n] = loop.create_future()
                self.parked.pop(n).set_result(None)
                if not await approval:
                    raise RuntimeError("declined")
                self.continued[n] = clock()
                output = await overhead.add(**args)
            else:
                output = await overhead.get_weather(**args)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
        final = await self.post(messages)
        self.finished.pop(n).set_result(final["content"])

    async def run_once(self) -> str:
        return await self.run()

    async def park(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        parked = self.parked[n] = loop.create_future()
        self.finished[n] = loop.create_future()
        self.spawn(self.parked_run(n))
        await parked

    async def wake(self, n: int) -> str:
        finished = self.finished[n]
        self.approvals.pop(n).set_result(True)
        return await finished

    def continued_at(self, n: int) -> float:
        return self.continued.pop(n)


if __name__ == "__main__":
    _harness.main(Floor())
