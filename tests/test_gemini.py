"""The gemini style on what no recording holds: a suspension across a Gemini tool call
(with and without the API's ids), blocks by the safety filters, the output limit, Google's
error JSON and its retries, the key kept out of errors, and the codec's own rules (URLs,
ids, the order of function responses, extra_body). Replies are written the way the API's
reference documents them, through a real :class:`LlmClient` over the fake provider."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from toolnexus_async import (
    Answer,
    AssistantMessage,
    LlmClient,
    Message,
    ModelSettings,
    ProtocolError,
    ProviderError,
    Request,
    RetryPolicy,
    RunResult,
    StreamDone,
    SystemMessage,
    ToolCall,
    ToolContext,
    Toolkit,
    ToolResult,
    ToolReturn,
    UserMessage,
    define_tool,
)
from toolnexus_async._core.codecs import codec_for
from toolnexus_async._core.output import output_spec
from toolnexus_async.testing import json_response, sse_response

from .conftest import FakeLLM, FakeProvider

GEMINI = codec_for("gemini")
SIGNATURE = "EpIDCo8DAQw51scL+dHffCC+bznOIyXjDPleN5yQ"


def call_part(name: str, args: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {"name": name, "args": args}
    if call_id is not None:
        call["id"] = call_id
    return {"functionCall": call}


def gemini_reply(*parts: dict[str, Any], finish: str = "STOP", **extra: Any) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}}
    if finish:
        candidate["finishReason"] = finish
    return {
        "candidates": [candidate],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": "gemini-2.5-flash",
        "responseId": "resp-1",
        **extra,
    }


@dataclasses.dataclass
class Verdict:
    ok: bool


@define_tool
async def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


@define_tool
async def delete_file(path: str, ctx: ToolContext | None = None) -> ToolResult:
    """Delete a file; a person approves it first."""
    if ctx is None or ctx.answer is None:
        return ToolResult.pending(Request("", "approval", f"Delete {path}?"))
    return ToolResult.ok(f"deleted {path}")


def kit() -> Toolkit:
    return Toolkit.create(builtins=False, extra_tools=[lookup, delete_file])


async def test_a_run_halted_on_approval_resumes_with_responses_in_call_order(
    provider: FakeProvider,
):
    """Gemini 2 calls come without ids: the run halts on the approval, is stored, and the
    resumed request answers both calls in their order, by name, with no id."""
    provider.script(
        gemini_reply(call_part("lookup", {"q": "a"}), call_part("delete_file", {"path": "x"})),
        gemini_reply({"text": "done"}),
    )
    async with provider.client("gemini") as client, kit() as toolkit:
        halted = await client.run("clean up", toolkit)
    assert halted.status == "pending" and halted.pending is not None
    assert halted.pending.prompt == "Delete x?"
    ids = [record.call.id for record in halted.tool_calls]
    assert len(set(ids)) == 2 and all(i.startswith("gcall_") for i in ids)
    stored = RunResult.from_dict(json.loads(json.dumps(halted.to_dict())))
    async with provider.client("gemini") as client, kit() as toolkit:
        result = await client.resume(stored, toolkit, answers=Answer(halted.pending.id, ok=True))
    assert (result.status, result.text) == ("done", "done")
    user, model, answers = provider.bodies[1]["contents"]
    assert user == {"role": "user", "parts": [{"text": "clean up"}]}
    assert model == {
        "role": "model",
        "parts": [call_part("lookup", {"q": "a"}), call_part("delete_file", {"path": "x"})],
    }
    assert answers == {
        "role": "user",
        "parts": [
            {"functionResponse": {"name": "lookup", "response": {"output": "found a"}}},
            {"functionResponse": {"name": "delete_file", "response": {"output": "deleted x"}}},
        ],
    }


async def test_an_approval_answered_mid_run_sends_the_id_and_signature_back(
    provider: FakeProvider,
):
    """Gemini 3 gives ids and a thoughtSignature: answered by wait_for, the follow-up
    carries the signed call as it came and a response with the same id."""
    signed = {**call_part("delete_file", {"path": "x"}, "a1b2c3d4"), "thoughtSignature": SIGNATURE}
    provider.script(gemini_reply(signed), gemini_reply({"text": "gone"}))
    asked: list[Request] = []

    async def approve(request: Request) -> Answer:
        asked.append(request)
        return Answer(request.id, ok=True)

    async with provider.client("gemini", wait_for=approve) as client, kit() as toolkit:
        result = await client.run("delete x", toolkit)
    assert (result.status, result.text) == ("done", "gone")
    assert [r.kind for r in asked] == ["approval"]
    _, model, answer = provider.bodies[1]["contents"]
    assert model["parts"] == [signed]
    assert answer["parts"] == [
        {
            "functionResponse": {
                "id": "a1b2c3d4",
                "name": "delete_file",
                "response": {"output": "deleted x"},
            }
        }
    ]


async def test_a_signed_call_halted_and_stored_goes_back_signed(provider: FakeProvider):
    """The parts Gemini 3 requires back are stored with the halted run: a resume from its
    JSON form sends the call with its signature and id, then the matching response."""
    signed = {**call_part("delete_file", {"path": "x"}, "e5f6"), "thoughtSignature": SIGNATURE}
    provider.script(gemini_reply(signed), gemini_reply({"text": "gone"}))
    async with provider.client("gemini") as client, kit() as toolkit:
        halted = await client.run("delete x", toolkit)
    assert halted.pending is not None
    stored = RunResult.from_dict(json.loads(json.dumps(halted.to_dict())))
    async with provider.client("gemini") as client, kit() as toolkit:
        result = await client.resume(stored, toolkit, answers=Answer(halted.pending.id, ok=True))
    assert result.text == "gone"
    _, model, answer = provider.bodies[1]["contents"]
    assert model["parts"] == [signed]
    assert answer["parts"][0]["functionResponse"]["id"] == "e5f6"


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_safety_block_is_a_refusal_not_a_crash(provider: FakeProvider, streamed: bool):
    rating = {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": True}
    blocked = {"candidates": [{"finishReason": "SAFETY", "safetyRatings": [rating]}]}
    provider.script(sse_response([blocked]) if streamed else blocked)
    async with provider.client("gemini") as client, kit() as toolkit:
        if streamed:
            async with client.stream("bad", toolkit, output_type=Verdict) as events:
                (done,) = [e async for e in events if isinstance(e, StreamDone)]
            result = done.result
        else:
            result = await client.run("bad", toolkit, output_type=Verdict)
    assert (result.status, result.output, result.text) == ("done", None, "")
    assert result.refusal is not None and "SAFETY" in result.refusal
    assert "HARM_CATEGORY_DANGEROUS_CONTENT" in result.refusal
    assert len(provider.requests) == 1  # a refusal is never retried as invalid output


async def test_a_blocked_prompt_is_a_refusal_and_says_nothing_in_the_next_turn(
    provider: FakeProvider,
):
    provider.script(
        {"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}},
        gemini_reply({"text": "hello"}),
    )
    async with provider.client("gemini") as client, kit() as toolkit:
        first = await client.run("bad", toolkit)
        await client.run("hi", toolkit, history=first.messages)
    assert first.refusal == "Gemini blocked the prompt (blockReason PROHIBITED_CONTENT)"
    # The blocked reply said nothing: no model turn, the two user turns travel as one.
    assert provider.bodies[1]["contents"] == [
        {"role": "user", "parts": [{"text": "bad"}, {"text": "hi"}]}
    ]


async def test_max_tokens_ends_the_run_incomplete(provider: FakeProvider):
    provider.script(gemini_reply({"text": '{"ok": tr'}, finish="MAX_TOKENS"))
    settings = ModelSettings(max_tokens=5)
    async with provider.client("gemini", settings=settings) as client, kit() as toolkit:
        result = await client.run("judge", toolkit, output_type=Verdict)
    assert (result.status, result.limit, result.output) == ("incomplete", "max_tokens", None)
    assert provider.bodies[0]["generationConfig"]["maxOutputTokens"] == 5


def google_error(code: int, status: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": status}}


async def test_429_and_503_are_retried_and_a_400_is_not(provider: FakeProvider):
    provider.script(
        json_response(google_error(429, "RESOURCE_EXHAUSTED", "Quota exceeded"), 429),
        json_response(google_error(503, "UNAVAILABLE", "The model is overloaded."), 503),
        gemini_reply({"text": "ok"}),
        json_response(google_error(400, "INVALID_ARGUMENT", "bad schema"), 400),
    )
    client = provider.client("gemini", retry=RetryPolicy(base_delay=0))
    async with client, kit() as toolkit:
        assert (await client.run("hi", toolkit)).text == "ok"
        with pytest.raises(ProviderError) as caught:
            await client.run("hi", toolkit)
    assert caught.value.status == 400 and "INVALID_ARGUMENT" in caught.value.body
    assert len(provider.requests) == 4


async def test_an_error_inside_a_stream_has_its_status(provider: FakeProvider):
    provider.script(
        sse_response([google_error(503, "UNAVAILABLE", "overloaded")]),
        sse_response([gemini_reply({"text": "ok"})]),
    )
    client = provider.client("gemini", retry=RetryPolicy(base_delay=0))
    async with client, kit() as toolkit, client.stream("hi", toolkit) as events:
        texts = [e.text async for e in events if e.kind == "text"]
    assert texts == ["ok"] and len(provider.requests) == 2


async def test_the_key_never_shows(provider: FakeProvider):
    key = "AIzaSy-very-secret-key-0123456789"
    provider.script((403, f"API key {key} not valid"))
    client = provider.client("gemini", api_key=key, retry=RetryPolicy(retries=0))
    async with client, kit() as toolkit:
        with pytest.raises(ProviderError) as caught:
            await client.run("hi", toolkit)
    assert provider.requests[0].headers["x-goog-api-key"] == key
    assert key not in str(caught.value) and key not in repr(caught.value)
    assert key not in repr(client)


async def test_a_403_without_a_key_says_where_the_key_comes_from(
    provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    denied = google_error(403, "PERMISSION_DENIED", "Method doesn't allow unregistered callers")
    provider.script(json_response(denied, 403))
    client = provider.client("gemini", api_key="")
    async with client, kit() as toolkit:
        with pytest.raises(ProviderError) as caught:
            await client.run("hi", toolkit)
    assert "x-goog-api-key" not in provider.requests[0].headers
    assert caught.value.hint is not None and "GEMINI_API_KEY" in caught.value.hint


def test_urls_name_the_model_and_the_stream_method():
    assert GEMINI.url(GEMINI.endpoint("https://g.test/"), "gemini-2.5-pro", False) == (
        "https://g.test/v1beta/models/gemini-2.5-pro:generateContent"
    )
    # A base URL that names its version keeps it; "models/" is not doubled.
    assert GEMINI.url(GEMINI.endpoint("https://g.test/v1"), "models/m", True) == (
        "https://g.test/v1/models/m:streamGenerateContent?alt=sse"
    )
    # A model name cannot reach the query.
    assert GEMINI.url("https://g.test/v1beta", "m?key=x", False).endswith(
        "/models/m%3Fkey%3Dx:generateContent"
    )


def test_local_ids_are_stable_and_never_sent():
    reply = gemini_reply(call_part("lookup", {"q": "a"}), call_part("lookup", {"q": "a"}))
    first, again = GEMINI.decode(reply), GEMINI.decode(json.loads(json.dumps(reply)))
    ids = [c.id for c in first.message.tool_calls]
    assert ids == [c.id for c in again.message.tool_calls] and len(set(ids)) == 2
    returns = [ToolReturn(i, "lookup", f"r{n}") for n, i in enumerate(ids)]
    # Results out of order are put back in the order of the calls.
    messages: list[Message] = [UserMessage("go"), first.message, returns[1], returns[0]]
    body = GEMINI.encode(messages, [], model="m", max_tokens=None)
    sent = [p["functionResponse"] for p in body["contents"][2]["parts"]]
    assert [s["response"]["output"] for s in sent] == ["r0", "r1"]
    assert all("id" not in s for s in sent)


def test_an_error_result_is_sent_as_an_error_and_system_messages_join():
    messages: list[Message] = [
        SystemMessage("Be brief."),
        SystemMessage("Use JSON."),
        UserMessage("go"),
        AssistantMessage(None, (ToolCall("c1", "lookup", {"q": "a"}),)),
        ToolReturn("c1", "lookup", "no such thing", is_error=True),
    ]
    body = GEMINI.encode(messages, [], model="m", max_tokens=None)
    assert body["systemInstruction"] == {"parts": [{"text": "Be brief.\n\nUse JSON."}]}
    assert body["contents"][2]["parts"] == [
        {"functionResponse": {"id": "c1", "name": "lookup", "response": {"error": "no such thing"}}}
    ]


def test_extra_body_merges_into_the_generation_config_and_tools():
    spec = output_spec(Verdict, style="gemini")
    extra = {"generationConfig": {"temperature": 0}, "tools": [{"googleSearch": {}}]}
    body = GEMINI.encode(
        [UserMessage("go")], [lookup], model="m", max_tokens=None, extra=extra, output=spec
    )
    assert body["generationConfig"]["temperature"] == 0
    assert body["generationConfig"]["responseJsonSchema"] == spec.wire
    assert [list(t) for t in body["tools"]] == [["functionDeclarations"], ["googleSearch"]]


async def test_a_client_reads_its_key_from_gemini_api_key(
    monkeypatch: pytest.MonkeyPatch, fake_llm: FakeLLM
):
    monkeypatch.setenv("GEMINI_API_KEY", "gm-from-the-environment")
    fake_llm.handler = lambda body, seen: gemini_reply({"text": "hi"})
    async with LlmClient(fake_llm.url, "gemini", "gemini-2.5-flash") as client, kit() as toolkit:
        assert (await client.run("hi", toolkit)).text == "hi"
    (seen,) = fake_llm.requests
    assert seen.headers["x-goog-api-key"] == "gm-from-the-environment"
    assert seen.path == "/v1beta/models/gemini-2.5-flash:generateContent"


async def test_thoughts_are_reasoning_streamed_or_not(provider: FakeProvider):
    """``thought`` parts (with ``includeThoughts``) are the model's reasoning: streamed as
    StreamReasoning, kept apart from the text, the same whole or in pieces."""
    thought = {"text": "The user wants a greeting.", "thought": True}
    whole = gemini_reply(thought, {"text": "Hello there"})
    pieces = [
        gemini_reply({"text": "The user wants", "thought": True}, finish=""),
        gemini_reply({"text": " a greeting.", "thought": True}, finish=""),
        gemini_reply({"text": "Hello"}, finish=""),
        gemini_reply({"text": " there"}),
    ]
    provider.script(whole, sse_response(pieces))
    async with provider.client("gemini") as client, kit() as toolkit:
        unstreamed = await client.run("hi", toolkit)
        async with client.stream("hi", toolkit) as events:
            seen = [e async for e in events]
    streamed = seen[-1].result  # type: ignore[union-attr]
    assert [e.text for e in seen if e.kind == "reasoning"] == ["The user wants", " a greeting."]
    assert [e.text for e in seen if e.kind == "text"] == ["Hello", " there"]
    for result in (unstreamed, streamed):
        assert result.text == "Hello there"
        last = result.messages[-1]
        assert isinstance(last, AssistantMessage)
        (reasoning,) = last.reasoning
        assert (reasoning.text, reasoning.style) == ("The user wants a greeting.", "gemini")


async def test_a_stream_cut_before_its_finish_reason_is_an_error(provider: FakeProvider):
    provider.script(sse_response([gemini_reply({"text": "Hel"}, finish="")]))
    client = provider.client("gemini", retry=RetryPolicy(retries=0))
    async with client, kit() as toolkit:
        with pytest.raises(ProtocolError, match="gemini stream ended before a finishReason"):
            async with client.stream("hi", toolkit) as events:
                _ = [e async for e in events]
