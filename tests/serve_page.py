"""An inbox whose runs ask whatever a test wants, run as a child process by the page tests
(tests/test_serve_page.py) and the page benchmark (benchmarks/serve_page.py).

``python -m tests.serve_page STORE TOKEN [PORT]`` serves the inbox (``create_app``,
``run_server`` on 127.0.0.1, port ``PORT`` or any free one, printing ``Open the inbox:
<url>/?token=<token>`` when it listens) on a SQLite store at ``STORE``. The model
(``tests/serve_acting.py``'s) is scripted by the prompt: a JSON object ``{"tool": name,
"arguments": {...}}`` makes it call that tool once, exactly so, then end with
``"<tool>: <output>"``. The tools:

- ``question``: the built-in, so its options and answers are the real ones;
- ``form``: an ``input`` request whose form is ``arguments["schema"]``;
- ``pay``: an approval (``data.digest``, not editable), then ``"paid <invoice>"``;
- ``act``: an approval whose arguments the approver may edit (``data.editable``), then
  ``"act ran with <the JSON of the arguments it ran with>"``;
- ``echo``: no request; its output is ``arguments["text"]``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import anyio

from tests.serve_acting import model  # the prompt's one call, then its result as the final text
from toolnexus_async import LlmClient, Request, Tool, ToolContext, Toolkit, ToolResult, define_tool
from toolnexus_async.durable import SqliteRunStore
from toolnexus_async.serve import create_app, run_server
from toolnexus_async.tools.builtin.question import QuestionTool


def _digest(tool: str, arguments: dict[str, Any]) -> str:
    canonical = json.dumps([tool, arguments], sort_keys=True, ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


@define_tool
async def form(schema: dict[str, Any], ctx: ToolContext | None = None) -> ToolResult:
    """Ask for the fields of ``schema``; return what was filled in, as JSON."""
    if ctx is None or ctx.answer is None:
        return ToolResult.pending(Request("", "input", "Fill in the form", data={"schema": schema}))
    return ToolResult.ok(json.dumps(ctx.answer.data))


@define_tool
async def pay(invoice: int, to: str, ctx: ToolContext | None = None) -> ToolResult:
    """Pay an invoice once a person approves."""
    arguments = {"invoice": invoice, "to": to}
    if ctx is None or ctx.answer is None:
        data = {"tool": "pay", "arguments": arguments, "digest": _digest("pay", arguments)}
        return ToolResult.pending(
            Request("", "approval", f"Pay invoice {invoice} to {to}?", data=data)
        )
    return ToolResult.ok(f"paid {invoice}")


@define_tool
async def act(command: str, ctx: ToolContext | None = None) -> ToolResult:
    """Run ``command`` once a person approves it, as it is or as they changed it."""
    arguments: dict[str, Any] = {"command": command}
    if ctx is None or ctx.answer is None:
        data = {
            "tool": "act",
            "arguments": arguments,
            "digest": _digest("act", arguments),
            "editable": True,
        }
        return ToolResult.pending(Request("", "approval", f"Run act: {command}", data=data))
    answer = ctx.answer.data or {}
    ran = answer.get("arguments", arguments)
    return ToolResult.ok(f"act ran with {json.dumps(ran, ensure_ascii=False)}")


@define_tool
async def echo(text: str) -> str:
    """Say ``text`` back."""
    return text


async def main(store_path: str, token: str, port: int) -> None:
    tools: list[Tool] = [QuestionTool(), form, pay, act, echo]
    async with (
        SqliteRunStore(store_path) as store,
        Toolkit.create(builtins=False, extra_tools=tools) as toolkit,
    ):
        app = create_app(
            make_client=lambda inbox: LlmClient.in_process(model, wait_for=inbox),
            toolkit=toolkit,
            store=store,
            token=token,
            # No run spills while a test looks at it; the default max_active_runs (10,000)
            # admits the benchmark's 1,000.
            park_timeout=3600.0,
        )

        def ready(url: str) -> None:
            print(f"Open the inbox: {url}/?token={token}", flush=True)

        await run_server(app, port=port, on_ready=ready)


if __name__ == "__main__":
    store_arg, token_arg = sys.argv[1:3]
    port_arg = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    anyio.run(main, store_arg, token_arg, port_arg)
