"""OpenAI Agents SDK: an ``Agent`` whose model is ``OpenAIChatCompletionsModel`` on an
``AsyncOpenAI(base_url=...)`` (the SDK's documented way to use another OpenAI-compatible
provider), the two tools as ``@function_tool`` functions, ``await Runner.run(agent, prompt)``;
the final text is ``result.final_output``. Tracing is switched off
(``set_tracing_disabled(True)``): it would export every run to OpenAI's servers.

Parking: the SDK's tool approvals. ``add`` is a ``function_tool(needs_approval=True)``: the run
*ends* with ``result.interruptions`` (``get_weather`` has run), and what must be kept per
waiting run is its ``RunState`` (``result.to_state()``). Waking is ``state.approve(item)``
then ``Runner.run(agent, state)``, which runs ``add`` and the final model turn.
"""

from __future__ import annotations

from typing import Any

import _harness
from _harness import ADD_DOC, WEATHER_DOC, clock
from _openai_pool import unbounded_http_client
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI


class OpenAiAgents:
    name = "openai-agents"
    packages: tuple[str, ...] = ("openai-agents", "openai", "httpx2")
    parks = True
    mechanism = (
        "tool approvals: needs_approval=True ends the run with result.interruptions;"
        " kept per run: its RunState (result.to_state())"
    )

    async def start(self, base_url: str) -> None:
        set_tracing_disabled(True)
        self.openai = AsyncOpenAI(
            base_url=base_url, api_key=_harness.API_KEY, http_client=unbounded_http_client()
        )
        model = OpenAIChatCompletionsModel(model=_harness.MODEL, openai_client=self.openai)
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
        weather_tool = function_tool(get_weather)
        self.agent = Agent(name="bench", model=model, tools=[weather_tool, function_tool(add)])
        gated_add = function_tool(approved_add, name_override="add", needs_approval=True)
        self.gated = Agent(name="bench", model=model, tools=[weather_tool, gated_add])
        self.waiting: dict[int, tuple[Any, Any]] = {}

    async def close(self) -> None:
        await self.openai.close()

    async def run_once(self) -> str:
        result = await Runner.run(self.agent, _harness.PROMPT)
        output: str = result.final_output
        return output

    async def park(self, n: int) -> None:
        result = await Runner.run(self.gated, _harness.PROMPT)
        if len(result.interruptions) != 1:
            raise SystemExit(f"openai-agents: expected one approval, got {result.interruptions}")
        self.waiting[n] = (result.to_state(), result.interruptions[0])

    async def wake(self, n: int) -> str:
        self.current = n
        state, item = self.waiting.pop(n)
        state.approve(item)
        result = await Runner.run(self.gated, state)
        return str(result.final_output)

    def continued_at(self, n: int) -> float:
        return self.continued.pop(n)


if __name__ == "__main__":
    _harness.main(OpenAiAgents())
