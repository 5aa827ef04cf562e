"""The agent of the MCP question tests: an in-process model, and a resume a new process runs.

The model reads its prompt as ``<tool> <JSON arguments>``, calls that tool once, and ends
with what the tool returned (``error: `` in front of an error result).

    python -m tests.mcp_servers.agent resume CONFIG DB REQUEST_ID ANSWER_JSON

resumes a run kept in the SQLite file DB with ``Answer.from_dict(ANSWER_JSON)`` (its id
is REQUEST_ID), on a toolkit built from the JSON config file CONFIG, and prints the run's
status and text as one JSON line.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio

from toolnexus_async import Answer, LlmClient, Message, Toolkit, ToolReturn, UserMessage
from toolnexus_async.durable import SqliteRunStore, resume_stored
from toolnexus_async.testing import reply, tool_call


def model(messages: list[Message], tools: list[Any]) -> Any:
    last = messages[-1]
    if isinstance(last, ToolReturn):
        return ("error: " if last.is_error else "") + last.output
    [prompt] = [m.text for m in messages if isinstance(m, UserMessage)]
    name, _, args = prompt.partition(" ")
    return reply(tool_call(name, json.loads(args or "{}"), id="c1"))


async def resume(config: str, db: str, answer: dict[str, Any]) -> None:
    async with (
        SqliteRunStore(db) as store,
        Toolkit.create(builtins=False, mcp=config) as toolkit,
        LlmClient.in_process(model) as client,
    ):
        done = await resume_stored(client, toolkit, store, Answer.from_dict(answer))
    print(json.dumps({"status": done.status, "text": done.text}))


if __name__ == "__main__":
    _, command, config, db, request_id, answer = sys.argv
    assert command == "resume"
    anyio.run(resume, config, db, {"id": request_id, **json.loads(answer)})
