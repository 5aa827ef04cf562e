"""Upstream toolnexus (its Python port, the ``toolnexus`` distribution): ``create_toolkit(
extra_tools=[define_tool(...), ...], builtins=False)``, ``create_client(base_url=...,
style="openai", model=...)``, ``await client.run(prompt, toolkit)``; the final text is
``result.text``. Its defaults are kept: each model request is a blocking ``urllib`` POST in
asyncio's default thread pool (a new connection per request).

No parking here: its ``wait_for`` suspension is the model this project took over, and the
approval scenario is measured for the three other frameworks.
"""

from __future__ import annotations

from typing import Any

import _harness
from _harness import ADD_DOC, WEATHER_DOC
from toolnexus import create_client, create_toolkit, define_tool


class Toolnexus:
    name = "toolnexus"
    packages: tuple[str, ...] = ("toolnexus",)
    parks = False
    mechanism = ""

    async def start(self, base_url: str) -> None:
        def get_weather(city: str) -> str:
            return _harness.weather(city)

        def add(a: int, b: int) -> str:
            return _harness.addition(a, b)

        self.toolkit = await create_toolkit(
            extra_tools=[
                define_tool(get_weather, name="get_weather", description=WEATHER_DOC),
                define_tool(add, name="add", description=ADD_DOC),
            ],
            builtins=False,
        )
        self.client: Any = create_client(
            base_url=base_url, style="openai", model=_harness.MODEL, api_key=_harness.API_KEY
        )

    async def close(self) -> None:
        await self.toolkit.close()

    async def run_once(self) -> str:
        result = await self.client.run(_harness.PROMPT, self.toolkit)
        return str(result.text)

    async def park(self, n: int) -> None:
        raise NotImplementedError

    async def wake(self, n: int) -> str:
        raise NotImplementedError

    def continued_at(self, n: int) -> float:
        raise NotImplementedError


if __name__ == "__main__":
    _harness.main(Toolnexus())
