"""Real OpenAI-style providers, as they really answer: recorded replies replayed through a
real :class:`LlmClient` over the fake provider (``tests/recordings/``, see SOURCES.md)."""

from __future__ import annotations

from toolnexus_async import LlmClient, Toolkit, define_tool

from .conftest import FakeProvider
from .replay import replay

GEMINI_WITHOUT_ID = "pydantic-ai/test_openai/test_compatible_api_with_tool_calls_without_id.yaml"


@define_tool
async def get_current_time() -> str:
    """Get the current time."""
    return "Noon"


def clock() -> Toolkit:
    return Toolkit.create(builtins=False, extra_tools=[get_current_time])


async def run_gemini(provider: FakeProvider) -> tuple[str, str, list[str]]:
    replay(provider, GEMINI_WITHOUT_ID)
    client: LlmClient = provider.client(model="gemini-2.5-pro-preview-05-06")
    async with client, clock() as toolkit:
        result = await client.run("What is the current time?", toolkit)
    assert (result.status, result.text) == ("done", "The current time is Noon.")
    (record,) = result.tool_calls
    follow_up = provider.bodies[-1]["messages"]
    sent_ids = [follow_up[1]["tool_calls"][0]["id"], follow_up[2]["tool_call_id"]]
    return record.id, record.result.output, sent_ids


async def test_gemini_tool_call_with_an_empty_id_gets_a_stable_id(provider: FakeProvider):
    """Gemini's OpenAI-compatible endpoint sends ``"id": ""``: the call runs under an id
    derived from the reply, and its result goes back paired with that same id."""
    call_id, output, sent_ids = await run_gemini(provider)
    assert call_id.startswith("call_") and len(call_id) > len("call_")
    assert output == "Noon"
    assert sent_ids == [call_id, call_id]
    # Deterministic: the same recorded reply gives the same id in another run.
    again = FakeProvider()
    assert (await run_gemini(again))[0] == call_id
