"""``toolnexus-async demo``: the embedded agent in the terminal.

Rule of this module: terminal I/O only. The demo's model and tools are in ``_demo.py``;
this narrates each step and asks the person at the terminal when a tool suspends.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

import anyio

from ._core.messages import AssistantMessage, Message
from ._core.types import Answer, Request, Tool, ToolContext, ToolResult, request_in
from ._demo import demo_model, demo_tools
from ._engine.client import LlmClient
from ._io.terminal import terminal_input
from .tools._standard import Toolkit

__all__ = ("run_demo",)


class _Narrated:
    """A tool that prints each call and its result, then defers to the real tool."""

    def __init__(self, tool: Tool, out: TextIO) -> None:
        self._tool = tool
        self._out = out
        self.name = tool.name
        self.description = tool.description
        self.input_schema = tool.input_schema
        self.source = tool.source

    async def execute(self, args: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        again = " (again, with the answer)" if ctx is not None and ctx.answer is not None else ""
        print(f"  -> {self.name}({_args(args)}){again}", file=self._out)
        result = await self._tool.execute(args, ctx)
        request = request_in(result)
        if request is not None:
            print(
                f"  .. {self.name} waits for a human: {request.kind} {request.id}", file=self._out
            )
        else:
            mark = "!!" if result.is_error else "<-"
            print(f"  {mark} {self.name}: {result.output}", file=self._out)
        return result


def _args(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items())


class _Terminal:
    """Answers requests by asking the person at the terminal, one question at a time."""

    def __init__(self, *, assume_yes: bool, out: TextIO) -> None:
        self._yes = assume_yes
        self._out = out
        # Two calls of one turn may suspend at once; the person answers them in turn.
        self._lock = anyio.Lock()

    async def __call__(self, request: Request) -> Answer:
        async with self._lock:
            print(f"\n[{request.kind}] {request.prompt}", file=self._out)
            if request.url:
                print(f"  open: {request.url}", file=self._out)
            try:
                if request.kind == "input":
                    return await self._input(request)
                if request.kind == "question":
                    return await self._question(request)
                return await self._confirm(request)
            except EOFError:
                print("  (no terminal input: treated as cancelled)", file=self._out)
                return Answer(request.id, False, reason="cancelled")

    async def _ask(self, prompt: str, default: str) -> str:
        if self._yes:
            print(f"{prompt}{default}  (--yes)", file=self._out)
            return default
        # The prompt goes to the narration stream, so a captured transcript shows it too.
        print(prompt, end="", file=self._out, flush=True)
        text = await terminal_input()  # not input() in a thread: that holds up Ctrl-C
        return text.strip() or default

    async def _confirm(self, request: Request) -> Answer:
        reply = await self._ask("  approve? [y/N] ", "y" if self._yes else "n")
        if reply.lower() in ("y", "yes"):
            return Answer(request.id, True)
        return Answer(request.id, False, reason="declined")

    async def _input(self, request: Request) -> Answer:
        data = request.data or {}
        properties = data.get("schema", {}).get("properties", {})
        defaults = data.get("default", {})
        values: dict[str, Any] = {}
        for name, schema in properties.items():
            default = defaults.get(name, "")
            while True:
                raw = await self._ask(f"  {name} [{default}]: ", str(default))
                try:
                    values[name] = _coerce(raw, schema.get("type"))
                    break
                except ValueError:
                    print(
                        f"  please enter {_KIND_NAMES.get(schema.get('type'), 'a value')}",
                        file=self._out,
                    )
        return Answer(request.id, True, data=values)

    async def _question(self, request: Request) -> Answer:
        answers = []
        for item in (request.data or {}).get("questions", []):
            options = [
                o if isinstance(o, str) else o.get("label", "") for o in item.get("options") or []
            ]
            default = options[0] if options else ""
            answers.append(await self._ask(f"  {item.get('question', '')} [{default}]: ", default))
        return Answer(request.id, True, data={"answers": answers})


_KIND_NAMES = {"integer": "a whole number", "number": "a number", "boolean": "yes or no"}


def _coerce(raw: str, kind: object) -> object:
    if kind == "integer":
        return int(raw)
    if kind == "number":
        return float(raw)
    if kind == "boolean":
        return raw.lower() in ("y", "yes", "true", "1")
    return raw


async def run_demo(*, assume_yes: bool, prompt: str, out: TextIO | None = None) -> int:
    """Run the demo agent; returns the process exit status."""
    # Looked up at call time, so a redirected sys.stdout (tests, wrappers) is honoured.
    out = out if out is not None else sys.stdout

    def narrate_model(messages: list[Message], tools: list[Tool]) -> AssistantMessage:
        reply = demo_model(messages, tools)
        if reply.text:
            print(f"\nmodel: {reply.text}", file=out)
        return reply

    print(f"you: {prompt}", file=out)
    tools = [_Narrated(t, out) for t in demo_tools()]
    async with Toolkit.create(builtins=False, extra_tools=tools) as toolkit:
        client = LlmClient.in_process(
            narrate_model, model="demo", wait_for=_Terminal(assume_yes=assume_yes, out=out)
        )
        async with client:
            result = await client.run(prompt, toolkit)
    print(
        f"\nstatus: {result.status} after {result.turns} model turns, "
        f"{len(result.tool_calls)} tool calls",
        file=out,
    )
    print(f"answer: {result.text}", file=out)
    return 0 if result.status == "done" else 1
