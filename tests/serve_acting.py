"""The inbox over the acting built-ins, run as a child process by the browser tests.

``python -m tests.serve_acting STORE WORKSPACE TOKEN`` serves the approval inbox
(``create_app``, ``run_server`` on a free port of 127.0.0.1, printing ``Open the inbox:
<url>/?token=<token>`` when it listens) with the real ``bash`` and ``apply_patch`` tools,
asking before they act, confined to ``WORKSPACE``, on a SQLite store at ``STORE``. The
model is scripted by the prompt: a JSON object ``{"tool": name, "arguments": {...}}`` makes
it call that tool once, exactly so, then end with the result. It stands in for a model led
by a prompt injection: whatever it asks for reaches the page as the tool's own approval.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import anyio

from toolnexus_async import (
    AssistantMessage,
    LlmClient,
    Message,
    Tool,
    ToolCall,
    Toolkit,
    ToolReturn,
    UserMessage,
)
from toolnexus_async.durable import SqliteRunStore
from toolnexus_async.serve import create_app, run_server
from toolnexus_async.tools.builtin import ApplyPatchTool, BashTool, Workspace


def model(messages: Sequence[Message], tools: Any) -> AssistantMessage | str:
    """The prompt's one call, then its result as the final text."""
    done = [m for m in messages if isinstance(m, ToolReturn)]
    if done:
        return f"{done[0].name}: {done[0].output}"
    prompt = next(m.text for m in messages if isinstance(m, UserMessage))
    call = json.loads(prompt or "{}")
    return AssistantMessage(None, (ToolCall("c1", call["tool"], call["arguments"]),))


async def main(store_path: str, root: str, token: str) -> None:
    workspace = Workspace(root)
    tools: list[Tool] = [BashTool(workspace), ApplyPatchTool(workspace)]
    async with (
        SqliteRunStore(store_path) as store,
        Toolkit.create(builtins=False, extra_tools=tools) as toolkit,
    ):
        app = create_app(
            make_client=lambda inbox: LlmClient.in_process(model, wait_for=inbox),
            toolkit=toolkit,
            store=store,
            token=token,
        )

        def ready(url: str) -> None:
            print(f"Open the inbox: {url}/?token={token}", flush=True)

        await run_server(app, port=0, on_ready=ready)


if __name__ == "__main__":
    store_path, root, token = sys.argv[1:4]
    anyio.run(main, store_path, root, token)
