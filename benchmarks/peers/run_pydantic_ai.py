"""pydantic-ai: an ``Agent`` on ``OpenAIChatModel`` (Chat Completions) with an
``OpenAIProvider(base_url=...)``, the two tools registered with ``@agent.tool_plain``,
``await agent.run(prompt)``; the final text is ``result.output``.

Parking: pydantic-ai's deferred tools. ``add`` is registered with ``requires_approval=True``
on an agent whose ``output_type`` is ``[str, DeferredToolRequests]``: the run *ends* with a
``DeferredToolRequests`` output (``get_weather`` has run), and what must be kept per waiting
run is its message history, ``result.all_messages()``. Waking is a new run,
``agent.run(message_history=..., deferred_tool_results=DeferredToolResults(approvals=
{call_id: True}))``, which runs ``add`` and the final model turn.
"""

from __future__ import annotations

from typing import Any

import _harness
from _harness import ADD_DOC, WEATHER_DOC, clock
from _openai_pool import unbounded_http_client
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider


class PydanticAi:
    name = "pydantic-ai"
    packages: tuple[str, ...] = ("pydantic-ai-slim", "openai", "httpx2")
    parks = True
    mechanism = (
        "deferred tools: requires_approval=True ends the run with DeferredToolRequests;"
        " kept per run: result.all_messages()"
    )

    async def start(self, base_url: str) -> None:
        self.http = unbounded_http_client()
        provider = OpenAIProvider(
            base_url=base_url, api_key=_harness.API_KEY, http_client=self.http
        )
        model = OpenAIChatModel(_harness.MODEL, provider=provider)
        self.agent = agent = Agent(model)
        self.gated = gated = Agent(model, output_type=[str, DeferredToolRequests])
        self.continued: dict[int, float] = {}
        self.current = -1

        def get_weather(city: str) -> str:
            return _harness.weather(city)

        def add(a: int, b: int) -> str:
            return _harness.addition(a, b)

        def approved_add(a: int, b: int) -> str:
            # Only an approved call gets here, and wakes come one at a time.
            self.continued[self.current] = clock()
            return _harness.addition(a, b)

        get_weather.__doc__, add.__doc__, approved_add.__doc__ = WEATHER_DOC, ADD_DOC, ADD_DOC
        agent.tool_plain(get_weather)
        agent.tool_plain(add)
        gated.tool_plain(get_weather)
        gated.tool_plain(name="add", requires_approval=True)(approved_add)
        self.waiting: dict[int, tuple[list[Any], str]] = {}

    async def close(self) -> None:
        await self.http.aclose()

    async def run_once(self) -> str:
        result = await self.agent.run(_harness.PROMPT)
        output: str = result.output
        return output

    async def park(self, n: int) -> None:
        result = await self.gated.run(_harness.PROMPT)
        requests = result.output
        if not isinstance(requests, DeferredToolRequests) or len(requests.approvals) != 1:
            raise SystemExit(f"pydantic-ai: expected one approval request, got {requests!r}")
        self.waiting[n] = (result.all_messages(), requests.approvals[0].tool_call_id)

    async def wake(self, n: int) -> str:
        self.current = n
        messages, call_id = self.waiting.pop(n)
        result = await self.gated.run(
            message_history=messages,
            deferred_tool_results=DeferredToolResults(approvals={call_id: True}),
        )
        return str(result.output)

    def continued_at(self, n: int) -> float:
        return self.continued.pop(n)


if __name__ == "__main__":
    _harness.main(PydanticAi())
