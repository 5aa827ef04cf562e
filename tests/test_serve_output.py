"""serve's API with an output schema: ``POST /runs {"prompt", "output_schema"}`` checks the
schema when it arrives (400 for one that is none), the run is asked for it and validated,
and ``GET /runs/{id}`` (and the ``done`` event) carry the validated ``output``, on this
server and on the next one on the same store file. Over HTTP on 127.0.0.1, with the
runner ``serve`` uses; nothing sleeps to synchronise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.test_serve_api import TOKEN, closing, events, post, serving
from toolnexus_async import (
    AssistantMessage,
    LlmClient,
    Message,
    Request,
    SystemMessage,
    ToolCall,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    UserMessage,
    define_tool,
)
from toolnexus_async.durable import MemoryRunStore, SqliteRunStore
from toolnexus_async.serve import ServeInbox, create_app

LIMIT = 15

ORDER = {
    "type": "object",
    "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"}},
    "required": ["sku", "quantity"],
    "additionalProperties": False,
}


@define_tool
async def reserve(sku: str, ctx: ToolContext | None = None) -> ToolResult:
    """Reserve stock; a person approves first."""
    if ctx is None or ctx.answer is None:
        return ToolResult.pending(Request("", "approval", f"Reserve {sku}?"))
    return ToolResult.ok(f"reserved {sku}")


class Model:
    """Asks to reserve first (when ``ask_first``), then answers with ``replies`` in turn;
    ``told`` keeps what it was told of an invalid reply."""

    def __init__(self, *replies: str, ask_first: bool = False) -> None:
        self.replies = list(replies)
        self.ask_first = ask_first
        self.told: list[str] = []
        self.instructions: list[str] = []

    def __call__(self, messages: list[Message], tools: list[Any]) -> AssistantMessage | str:
        last = messages[-1]
        if isinstance(last, UserMessage) and "JSON Schema" in last.text and len(messages) > 2:
            self.told.append(last.text)
        self.instructions.extend(m.text for m in messages[:2] if isinstance(m, SystemMessage))
        if self.ask_first and not any(isinstance(m, ToolReturn) for m in messages):
            return AssistantMessage(None, (ToolCall("c1", "reserve", {"sku": "A-17"}),))
        return self.replies.pop(0)


def app_of(model: Model, toolkit: Toolkit, store: Any, **options: Any) -> Any:
    def make_client(inbox: ServeInbox) -> LlmClient:
        return LlmClient.in_process(model, model="orders", wait_for=inbox)

    return create_app(make_client=make_client, toolkit=toolkit, store=store, token=TOKEN, **options)


async def get(http: Any, path: str) -> tuple[int, Any]:
    async with http.get(path) as reply:
        return reply.status, await reply.json()


async def test_a_run_with_an_output_schema_ends_on_its_validated_output():
    model = Model('{"sku": "A-17"}', '{"sku": "A-17", "quantity": 3}', "hi there")
    with anyio.fail_after(LIMIT):
        async with Toolkit.create(builtins=False, extra_tools=[reserve]) as toolkit:
            store = MemoryRunStore()
            app = closing(app_of(model, toolkit, store), store)
            async with serving(app) as http, events(http) as stream:
                body = {"prompt": "Three of A-17", "output_schema": ORDER}
                status, started = await post(http, "/runs", body)
                assert status == 202
                done = await stream.until("done", run_id=started["id"])
                status, run = await get(http, f"/runs/{started['id']}")
                plain = (await post(http, "/runs", {"prompt": "hello"}))[1]["id"]
                await stream.until("done", run_id=plain)
                status_plain, run_plain = await get(http, f"/runs/{plain}")
    assert done["output"] == {"sku": "A-17", "quantity": 3}
    assert status == 200 and run["status"] == "done"
    assert run["output"] == {"sku": "A-17", "quantity": 3}
    assert run["output_schema"] == ORDER
    # The first reply missed a field: the model was told, and corrected it.
    assert len(model.told) == 1 and "quantity is required" in model.told[0]
    assert any('"quantity"' in text for text in model.instructions)
    # A run without a schema: its answer is its text, as before.
    assert (status_plain, run_plain["output"], run_plain["output_schema"]) == (200, None, None)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "nonsense"}, "'output_schema' is not a usable JSON Schema: invalid input schema"),
        ({"type": "object", "required": "sku"}, '"sku" is not of type "array"'),
        ({"$ref": "https://example.com/order.json"}, "points outside the schema"),
        ({"properties": {"sku": {"pattern": "("}}}, 'is not a \\"regex\\"'),
        (["not", "an", "object"], "'output_schema' must be a JSON Schema object"),
        ("order", "'output_schema' must be a JSON Schema object"),
    ],
)
async def test_a_schema_that_is_none_is_a_400_and_starts_nothing(schema: Any, message: str):
    model = Model()
    with anyio.fail_after(LIMIT):
        async with Toolkit.create(builtins=False) as toolkit:
            store = MemoryRunStore()
            app = closing(app_of(model, toolkit, store), store)
            async with serving(app) as http:
                status, error = await post(http, "/runs", {"prompt": "go", "output_schema": schema})
                listing = (await get(http, "/runs"))[1]
    assert status == 400
    assert message.replace("\\", "") in error["error"]
    assert listing["total"] == 0 and model.instructions == []


async def test_the_output_schema_outlives_a_restart(tmp_path: Path):
    """The run parks on an approval and the server stops; the next server on the same file
    resumes it on the answer, asks for the stored schema and validates against it."""
    path = tmp_path / "runs.sqlite"
    with anyio.fail_after(LIMIT):
        async with (
            SqliteRunStore(path) as store,
            Toolkit.create(builtins=False, extra_tools=[reserve]) as toolkit,
        ):
            first = Model(ask_first=True)
            async with serving(app_of(first, toolkit, store)) as http, events(http) as stream:
                body = {"prompt": "Three of A-17", "output_schema": ORDER}
                run_id = (await post(http, "/runs", body))[1]["id"]
                request = (await stream.until("pending", run_id=run_id))["request"]
        # The next server: not told the schema again; the store has it.
        async with (
            SqliteRunStore(path) as store,
            Toolkit.create(builtins=False, extra_tools=[reserve]) as toolkit,
        ):
            second = Model('{"sku": "A-17", "quantity": "3"}', '{"sku": "A-17", "quantity": 3}')
            async with serving(app_of(second, toolkit, store)) as http, events(http) as stream:
                status, waiting = await get(http, f"/runs/{run_id}")
                assert (status, waiting["output_schema"], waiting["output"]) == (200, ORDER, None)
                answered = await post(http, f"/requests/{request['id']}/answer", {"ok": True})
                assert answered[0] == 200
                done = await stream.until("done", run_id=run_id)
                status, run = await get(http, f"/runs/{run_id}")
    assert done["output"] == run["output"] == {"sku": "A-17", "quantity": 3}
    assert (status, run["status"], run["output_schema"]) == (200, "done", ORDER)
    # Validated on the second server against the stored schema: "3" was sent back.
    assert len(second.told) == 1 and "quantity must be integer, got string" in second.told[0]
    assert any('"quantity"' in text for text in second.instructions)
