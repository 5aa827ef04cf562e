"""LangGraph: the graph API's tool-calling agent, as LangGraph's own guides build it: a
``StateGraph(MessagesState)`` with a model node (``ChatOpenAI(base_url=...)`` from
langchain-openai, ``.bind_tools(tools)``, ``await model.ainvoke(messages)``), a prebuilt
``ToolNode`` and ``tools_condition`` between them; the tools are langchain-core ``@tool``
functions; ``await graph.ainvoke({"messages": [...]})`` and the final text is the last
message's content. (``create_react_agent`` builds the same graph but is deprecated in
LangGraph 1.x in favour of ``langchain.agents.create_agent``, another package.)

Parking: LangGraph's interrupts. The graph is compiled with an ``InMemorySaver``
checkpointer and ``add`` calls ``interrupt(...)``: ``ainvoke`` *returns* with
``__interrupt__`` and the thread's checkpoints stay in the saver, which is what must be kept
per waiting run. Waking is ``ainvoke(Command(resume=True), config)`` on the same
``thread_id``; LangGraph re-runs the interrupted node (so ``get_weather`` runs again, and
``add`` from its start, ``interrupt`` now returning the answer), then the final model turn.
"""

from __future__ import annotations

from typing import Any

import _harness
from _harness import ADD_DOC, WEATHER_DOC, clock
from _openai_pool import unbounded_http_client
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, interrupt


class LangGraph:
    name = "langgraph"
    packages: tuple[str, ...] = (
        "langgraph",
        "langchain-openai",
        "langchain-core",
        "openai",
        "httpx2",
    )
    parks = True
    mechanism = (
        "interrupts: interrupt() in the tool, InMemorySaver checkpointer; ainvoke returns"
        " with __interrupt__; kept per run: the thread's checkpoints"
    )

    async def start(self, base_url: str) -> None:
        self.http = unbounded_http_client()
        self.llm = ChatOpenAI(
            model=_harness.MODEL,
            base_url=base_url,
            api_key=_harness.API_KEY,
            http_async_client=self.http,
        )
        self.continued: dict[int, float] = {}
        self.current = -1

        def get_weather(city: str) -> str:
            return _harness.weather(city)

        def add(a: int, b: int) -> str:
            return _harness.addition(a, b)

        def approved_add(a: int, b: int) -> str:
            if interrupt({"approve": "add", "a": a, "b": b}) is not True:
                return "declined"
            # Only an approved call gets here, and wakes come one at a time.
            self.continued[self.current] = clock()
            return _harness.addition(a, b)

        get_weather.__doc__, add.__doc__, approved_add.__doc__ = WEATHER_DOC, ADD_DOC, ADD_DOC
        weather_tool = tool(get_weather)
        self.graph = self.build([weather_tool, tool(add)]).compile()
        gated = self.build([weather_tool, tool("add")(approved_add)])
        self.gated = gated.compile(checkpointer=InMemorySaver())

    def build(self, tools: list[Any]) -> StateGraph:
        model = self.llm.bind_tools(tools)

        async def call_model(state: MessagesState) -> dict[str, Any]:
            return {"messages": [await model.ainvoke(state["messages"])]}

        builder = StateGraph(MessagesState)
        builder.add_node("model", call_model)
        builder.add_node("tools", ToolNode(tools))
        builder.add_edge(START, "model")
        builder.add_conditional_edges("model", tools_condition)
        builder.add_edge("tools", "model")
        return builder

    async def close(self) -> None:
        await self.http.aclose()

    async def run_once(self) -> str:
        state = await self.graph.ainvoke({"messages": [("user", _harness.PROMPT)]})
        return str(state["messages"][-1].content)

    @staticmethod
    def config(n: int) -> Any:
        return {"configurable": {"thread_id": f"run-{n}"}}

    async def park(self, n: int) -> None:
        state = await self.gated.ainvoke({"messages": [("user", _harness.PROMPT)]}, self.config(n))
        if len(state.get("__interrupt__", ())) != 1:
            raise SystemExit(f"langgraph: expected one interrupt, got {state!r}")

    async def wake(self, n: int) -> str:
        self.current = n
        state = await self.gated.ainvoke(Command(resume=True), self.config(n))
        return str(state["messages"][-1].content)

    def continued_at(self, n: int) -> float:
        return self.continued.pop(n)


if __name__ == "__main__":
    _harness.main(LangGraph())
