"""The floor plus toolnexus_async's features, with no engine: where a park's cost would be
if the engine between those features cost nothing.

Each step is the package's own code, called straight from the run's coroutine as the
floor's hand-written run would call it, in the order the engine calls it:

- the transcript is typed (``UserMessage``, the reply's ``AssistantMessage``,
  ``ToolReturn``) and each request body is the OpenAI codec's encoding of it, as compact
  JSON with the toolkit's tools encoded once (``_body_bytes``);
- each reply is parsed (``hotjson.loads``) and decoded into a ``ModelReply``, its tool
  calls typed, and counted in a ``MetricsRegistry`` with its duration;
- each tool call goes through the toolkit (``execute_call``: the tool looked up, its
  arguments checked against its schema, its result a ``ToolResult``) and is counted;
- the ``add`` call is asked about by a ``require_approval`` gate (its prompt, the
  arguments' digest, a ``Request``), parked on an ``Inbox`` with the run's id, and woken
  by ``inbox.answer``; the run's end is counted too.

What the engine adds on top (the run loop's state, the executor and the suspension rule,
hooks dispatch, the records of each call, the run's result) is what this runner leaves out,
so ``park_rate.py --features`` shows the engine's share of a park and of a wake beside the
floor and the package (docs/performance.md, "The features without the engine").
It is a measuring stick, not a way to run agents: it handles only the scenario's replies.
"""

from __future__ import annotations

import time

import _harness
from _harness import clock
from _project import _mock, overhead
from run_floor import Floor

from toolnexus_async import (
    Answer,
    Inbox,
    MetricsRegistry,
    ToolResult,
    require_approval,
)
from toolnexus_async._core.codecs.openai import OpenAICodec
from toolnexus_async._core.hotjson import loads
from toolnexus_async._core.messages import Message, ModelReply, ToolReturn, UserMessage
from toolnexus_async._engine.hooks import plain_before_tool
from toolnexus_async._engine.model import _body_bytes


class Features(Floor):
    """The floor's run, its steps replaced by the package's features."""

    name = "features"
    packages: tuple[str, ...] = ("toolnexus-async", "aiohttp")
    parks = True
    mechanism = "the package's features called in a row (no engine); parks on an Inbox"

    async def start(self, base_url: str) -> None:
        await super().start(base_url)  # the floor's session, task group and tables
        self.headers = {
            "Authorization": f"Bearer {_mock.API_KEY}",
            "Content-Type": "application/json",
        }
        self.codec = OpenAICodec()
        self.metrics = MetricsRegistry()
        # The gate's verdict as the executor calls it: a plain call, no coroutine.
        verdict = plain_before_tool(require_approval(["add"]))
        assert verdict is not None
        self.verdict = verdict
        self.inbox = Inbox()
        self.toolkit = overhead.make_toolkit()  # the scenario's two tools, as overhead.py's
        self.request_of: dict[int, str] = {}

    async def ask(self, messages: list[Message]) -> ModelReply:
        body = self.codec.encode(messages, self.toolkit.specs, model=_mock.MODEL, max_tokens=None)
        started = time.perf_counter()
        async with self.session.post(
            self.url, data=_body_bytes(body), headers=self.headers
        ) as response:
            raw = await response.read()
            if response.status != 200:
                raise RuntimeError(f"features: HTTP {response.status}")
        reply = self.codec.decode(loads(raw))
        usage = reply.usage
        self.metrics.record_llm(
            _mock.MODEL,
            "ok",
            time.perf_counter() - started,
            usage.prompt_tokens,
            usage.completion_tokens,
        )
        return reply

    async def parked_run(self, n: int) -> None:
        run_started = time.perf_counter()
        run_id = f"run-{n}"
        messages: list[Message] = [UserMessage(overhead.PROMPT)]
        assistant = (await self.ask(messages)).message
        # Only the message is kept: the reply holds the decoded payload too, which no later
        # step needs (the engine lets it go as well), and a parked run would hold it.
        messages.append(assistant)
        for call in assistant.tool_calls:
            started = time.perf_counter()
            verdict = self.verdict(call.name, call.arguments, None)
            if isinstance(verdict, ToolResult):  # the gate asks: park until answered
                request = ToolResult.pending_of(verdict)
                assert request is not None
                self.metrics.record_tool(call.name, "native", "pending", 0.0)
                answer = self.inbox._park(request, run_id)
                self.request_of[n] = request.id
                self.parked.pop(n).set_result(None)
                got = await answer
                # The retry, as the engine makes it: the gate sees the approval (and any
                # arguments the approver changed) before the tool runs.
                if not got.ok or self.verdict(call.name, call.arguments, got) is not None:
                    raise RuntimeError("features: the approval did not let the call run")
                self.continued[n] = clock()
                started = time.perf_counter()
            result = await self.toolkit.execute_call(call.name, call.arguments, call.id, run_id, 1)
            outcome = "error" if result.is_error else "ok"
            self.metrics.record_tool(call.name, "native", outcome, time.perf_counter() - started)
            messages.append(ToolReturn(call.id, call.name, result.output, result.is_error))
        final = await self.ask(messages)
        self.metrics.record_run("done", time.perf_counter() - run_started)
        self.finished.pop(n).set_result(final.message.text or "")

    async def wake(self, n: int) -> str:
        finished = self.finished[n]
        await self.inbox.answer(Answer(self.request_of.pop(n), True))
        return await finished


if __name__ == "__main__":
    _harness.main(Features())
