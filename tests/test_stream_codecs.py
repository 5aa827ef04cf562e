"""Streamed replies (toolnexus_async/_codecs/_stream.py): SSE bytes through the parser and a
decoder, cut at awkward places, never touching a socket."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from toolnexus_async import (
    ModelReply,
    ProtocolError,
    ProviderError,
    Reasoning,
    ToolCall,
    Toolkit,
    Usage,
    UserMessage,
)
from toolnexus_async._core.codecs import codec_for
from toolnexus_async._core.codecs._sse import SSEEvent, SSEParser
from toolnexus_async._core.codecs._stream import (
    ArgumentsDelta,
    Delta,
    ReasoningDelta,
    StreamDecoder,
    TextDelta,
)
from toolnexus_async._core.codecs.anthropic import AnthropicCodec
from toolnexus_async._core.codecs.anthropic_stream import AnthropicStreamDecoder
from toolnexus_async._core.codecs.openai import OpenAICodec
from toolnexus_async._core.codecs.openai_stream import OpenAIStreamDecoder

OPENAI_URL = "https://api.openai.test/v1/chat/completions"
ANTHROPIC_URL = "https://api.anthropic.test/v1/messages"

# Chunk sizes that cut inside field names, JSON tokens, multi-byte characters and CRLFs.
CHUNK_SIZES = [1, 2, 3, 7, 64, 10_000]


# --- helpers --------------------------------------------------------------------------------


def openai_sse(*chunks: dict[str, Any] | str, eol: str = "\n") -> bytes:
    """OpenAI framing: unnamed events, compact JSON, ending with whatever the caller adds."""
    out = []
    for chunk in chunks:
        data = chunk if isinstance(chunk, str) else json.dumps(chunk, ensure_ascii=False)
        out.append(f"data: {data}{eol}{eol}")
    return "".join(out).encode()


def anthropic_sse(*events: dict[str, Any], eol: str = "\r\n") -> bytes:
    """Anthropic framing: each event named after its type, pretty-printed across no lines."""
    out = []
    for event in events:
        data = json.dumps(event, ensure_ascii=False)
        out.append(f"event: {event['type']}{eol}data: {data}{eol}{eol}")
    return "".join(out).encode()


def drive(decoder: StreamDecoder, raw: bytes, size: int) -> tuple[list[Delta], SSEParser]:
    """Feed ``raw`` through a parser in ``size``-byte chunks; every event to the decoder."""
    parser = SSEParser()
    deltas: list[Delta] = []
    for start in range(0, len(raw), size):
        for event in parser.feed(raw[start : start + size]):
            deltas.extend(decoder.feed(event))
    for event in parser.close():
        deltas.extend(decoder.feed(event))
    return deltas, parser


def stream_reply(make: Callable[[], StreamDecoder], raw: bytes) -> tuple[list[Delta], ModelReply]:
    """Decode ``raw`` at every chunk size; all must agree, and the first result is returned."""
    results = []
    for size in CHUNK_SIZES:
        decoder = make()
        deltas, parser = drive(decoder, raw, size)
        assert not parser.pending, f"chunk size {size}"
        results.append((deltas, decoder.finish()))
    for size, result in zip(CHUNK_SIZES, results, strict=True):
        # Deltas may be cut differently by the network in real life, but here one SSE
        # event is one delta whatever the byte chunking, so they must match exactly.
        assert result == results[0], f"chunk size {size}"
    return results[0]


def openai() -> OpenAIStreamDecoder:
    return OpenAIStreamDecoder(OPENAI_URL)


def anthropic() -> AnthropicStreamDecoder:
    return AnthropicStreamDecoder(ANTHROPIC_URL)


def oa_chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any):
    choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {"id": "chatcmpl-1", "model": "gpt-4o-2024", "choices": [choice], **extra}


def oa_call(index: int, arguments: str, call_id: str | None = None, name: str | None = None):
    fragment: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id is not None:
        fragment["id"] = call_id
        fragment["type"] = "function"
        fragment["function"]["name"] = name
    return oa_chunk({"tool_calls": [fragment]})


OA_USAGE = {
    "id": "chatcmpl-1",
    "model": "gpt-4o-2024",
    "choices": [],
    "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
}

OA_TEXT = openai_sse(
    oa_chunk({"role": "assistant", "content": ""}),
    oa_chunk({"content": "Hel"}),
    oa_chunk({"content": "lo, wörld 🌍"}),
    oa_chunk({"content": "!"}),
    oa_chunk({}, "stop"),
    OA_USAGE,
    "[DONE]",
)


def a_start(input_tokens: int = 25, **usage: int) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-x",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1, **usage},
        },
    }


def a_block(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def a_text(index: int, text: str) -> dict[str, Any]:
    return {
        "type": "content_block_delta",
        "index": index,
        "delta": {"type": "text_delta", "text": text},
    }


def a_json(index: int, partial: str) -> dict[str, Any]:
    delta = {"type": "input_json_delta", "partial_json": partial}
    return {"type": "content_block_delta", "index": index, "delta": delta}


def a_stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def a_end(reason: str, output_tokens: int) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


A_TEXT_EVENTS = [
    a_start(25, cache_read_input_tokens=5),
    {"type": "ping"},
    a_block(0, {"type": "text", "text": ""}),
    a_text(0, "Hel"),
    a_text(0, "lo, wörld 🌍"),
    a_stop(0),
    *a_end("end_turn", 15),
]

PING = {"type": "ping"}


def anthropic_tool_use(index: int, call_id: str) -> dict[str, Any]:
    return a_block(index, {"type": "tool_use", "id": call_id, "name": "get_weather", "input": {}})


# --- encode ---------------------------------------------------------------------------------


EMPTY = Toolkit.create(builtins=False)


def test_openai_encode_streams_with_usage_only_when_asked():
    """stream=True adds stream and include_usage; the default body is unchanged."""
    codec = OpenAICodec()
    plain = codec.encode([UserMessage("hi")], EMPTY.tools(), model="m", max_tokens=None)
    assert "stream" not in plain and "stream_options" not in plain
    assert (
        codec.encode([UserMessage("hi")], EMPTY.tools(), model="m", max_tokens=None, stream=False)
        == plain
    )
    streamed = codec.encode(
        [UserMessage("hi")], EMPTY.tools(), model="m", max_tokens=None, stream=True
    )
    assert streamed == {**plain, "stream": True, "stream_options": {"include_usage": True}}


def test_anthropic_encode_streams_only_when_asked():
    """stream=True adds "stream": true; the default body is unchanged."""
    codec = AnthropicCodec()
    plain = codec.encode([UserMessage("hi")], EMPTY.tools(), model="m", max_tokens=None)
    assert "stream" not in plain
    streamed = codec.encode(
        [UserMessage("hi")], EMPTY.tools(), model="m", max_tokens=None, stream=True
    )
    assert streamed == {**plain, "stream": True}


def test_extra_body_still_has_the_last_word_when_streaming():
    """extra is applied last, as for every other key: a server that rejects
    stream_options can be given something else."""
    body = OpenAICodec().encode(
        [UserMessage("hi")],
        EMPTY.tools(),
        model="m",
        max_tokens=None,
        extra={"stream_options": {"include_usage": False}},
        stream=True,
    )
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": False}


@pytest.mark.parametrize(
    ("style", "kind"), [("openai", OpenAIStreamDecoder), ("anthropic", AnthropicStreamDecoder)]
)
def test_each_codec_hands_out_a_fresh_decoder_of_its_style(style: str, kind: type):
    """codec.stream_decoder(url) is the style's decoder, new each time."""
    codec = codec_for(style)
    first, second = codec.stream_decoder("u"), codec.stream_decoder("u")
    assert isinstance(first, kind)
    assert first is not second


# --- openai ---------------------------------------------------------------------------------


def test_openai_text_stream_yields_deltas_and_the_same_reply_as_unstreamed():
    """Text arrives piece by piece; the reply equals decoding the whole reply at once."""
    deltas, reply = stream_reply(openai, OA_TEXT)
    assert deltas == [TextDelta("Hel"), TextDelta("lo, wörld 🌍"), TextDelta("!")]
    unstreamed = OpenAICodec().decode(
        {
            "model": "gpt-4o-2024",
            "choices": [{"message": {"content": "Hello, wörld 🌍!"}, "finish_reason": "stop"}],
            "usage": OA_USAGE["usage"],
        }
    )
    assert reply == unstreamed
    assert reply.usage == Usage(12, 5, 17)
    assert reply.stop_reason == "stop"
    assert reply.model == "gpt-4o-2024"


def test_openai_parallel_tool_calls_are_assembled_by_index():
    """Fragments of two calls interleave; id and name come from each index's first fragment."""
    raw = openai_sse(
        oa_chunk({"role": "assistant", "content": None}),
        oa_call(0, "", "call_a", "get_weather"),
        oa_call(0, '{"ci'),
        oa_call(1, '{"city": "Ro', "call_b", "get_weather"),
        oa_call(0, 'ty": "Os'),
        oa_call(1, 'me", "da'),
        oa_call(1, 'ys": 2}'),
        oa_call(0, 'lo"}'),
        oa_chunk({}, "tool_calls"),
        OA_USAGE,
        "[DONE]",
    )
    deltas, reply = stream_reply(openai, raw)
    # Each call's pieces, as they came, told apart by their index.
    assert deltas == [
        ArgumentsDelta("get_weather", '{"ci', 0),
        ArgumentsDelta("get_weather", '{"city": "Ro', 1),
        ArgumentsDelta("get_weather", 'ty": "Os', 0),
        ArgumentsDelta("get_weather", 'me", "da', 1),
        ArgumentsDelta("get_weather", 'ys": 2}', 1),
        ArgumentsDelta("get_weather", 'lo"}', 0),
    ]
    assert reply.message.text is None
    assert reply.message.tool_calls == (
        ToolCall("call_a", "get_weather", {"city": "Oslo"}),
        ToolCall("call_b", "get_weather", {"city": "Rome", "days": 2}),
    )
    assert reply.stop_reason == "tool_calls"


def test_openai_id_and_name_are_taken_from_the_first_fragment_only():
    """Servers that repeat id and name on later fragments change nothing and double nothing."""
    later = {"index": 0, "id": "call_a", "function": {"name": "get_weather", "arguments": "}"}}
    raw = openai_sse(
        oa_call(0, "{", "call_a", "get_weather"),
        oa_chunk({"tool_calls": [later]}),
        oa_chunk({}, "tool_calls"),
        "[DONE]",
    )
    _, reply = stream_reply(openai, raw)
    assert reply.message.tool_calls == (ToolCall("call_a", "get_weather", {}),)


def test_openai_calls_sharing_an_index_but_not_an_id_are_separate_calls():
    """Ollama streams every call of a parallel batch whole at index 0: each new id is a new
    call, and the reply is the one the unstreamed codec gives for the same calls."""
    calls = [
        {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": "{}"}},
        {"id": "call_b", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}},
        {"id": "call_c", "type": "function", "function": {"name": "other", "arguments": "{}"}},
    ]
    raw = openai_sse(
        oa_chunk({"role": "assistant", "tool_calls": [{"index": 0, **calls[0]}]}),
        oa_chunk({"tool_calls": [{"index": 0, **calls[1]}]}),
        # A later fragment of call_b, with its id repeated, is still call_b's.
        oa_chunk({"tool_calls": [{"index": 0, "id": "call_b", "function": {"arguments": ""}}]}),
        oa_chunk({"tool_calls": [{"index": 1, **calls[2]}]}),
        oa_chunk({}, "tool_calls"),
        "[DONE]",
    )
    _, reply = stream_reply(openai, raw)
    unstreamed = OpenAICodec().decode(
        {"choices": [{"message": {"tool_calls": calls}, "finish_reason": "tool_calls"}]}
    )
    assert reply.message.tool_calls == unstreamed.message.tool_calls
    assert [(c.id, c.name, c.arguments) for c in reply.message.tool_calls] == [
        ("call_a", "weather", {}),
        ("call_b", "add", {"a": 2}),
        ("call_c", "other", {}),
    ]


def test_openai_tool_calls_come_out_in_index_order_whatever_order_they_start():
    """The reply lists calls by index, as the unstreamed reply would."""
    raw = openai_sse(
        oa_call(1, "{}", "call_b", "second"),
        oa_call(0, "{}", "call_a", "first"),
        oa_chunk({}, "tool_calls"),
        "[DONE]",
    )
    _, reply = stream_reply(openai, raw)
    assert [c.id for c in reply.message.tool_calls] == ["call_a", "call_b"]


def test_openai_invalid_arguments_are_kept_raw_like_unstreamed():
    """Arguments that are not a JSON object end up in invalid_arguments, unparsed."""
    raw = openai_sse(
        oa_call(0, '{"city": ', "call_a", "get_weather"),
        oa_call(0, "Oslo}"),
        oa_call(1, "", "call_b", "no_args"),
        oa_chunk({}, "tool_calls"),
        "[DONE]",
    )
    _, reply = stream_reply(openai, raw)
    assert reply.message.tool_calls == (
        ToolCall("call_a", "get_weather", {}, '{"city": Oslo}'),
        ToolCall("call_b", "no_args", {}),
    )


@pytest.mark.parametrize(
    "arguments",
    [{"city": "Oslo"}, ["Oslo"], 5, True],
    ids=["object", "list", "number", "bool"],
)
def test_openai_arguments_sent_as_a_json_value_are_judged_like_unstreamed(arguments: Any):
    """Some servers send the arguments as a JSON value, not its text: an object is taken,
    anything else is invalid, exactly as in an unstreamed reply."""
    call = {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": arguments}}
    raw = openai_sse(
        oa_chunk({"tool_calls": [{"index": 0, **call}]}),
        # A null piece after it adds nothing.
        oa_chunk({"tool_calls": [{"index": 0, "function": {"arguments": None}}]}),
        oa_chunk({}, "tool_calls"),
        "[DONE]",
    )
    _, reply = stream_reply(openai, raw)
    unstreamed = OpenAICodec().decode({"choices": [{"message": {"tool_calls": [call]}}]})
    assert reply.message.tool_calls == unstreamed.message.tool_calls
    (decoded,) = reply.message.tool_calls
    if isinstance(arguments, dict):
        assert (decoded.arguments, decoded.invalid_arguments) == (arguments, None)
    else:
        assert (decoded.arguments, decoded.invalid_arguments) == ({}, json.dumps(arguments))


def test_openai_arguments_mixing_text_and_a_value_are_invalid_not_joined():
    """Text pieces and a value in one call make no one JSON value: invalid, never {}."""
    raw = openai_sse(
        oa_call(0, '{"city": ', "call_a", "get_weather"),
        oa_chunk({"tool_calls": [{"index": 0, "function": {"arguments": 5}}]}),
        oa_call(0, "}"),
        oa_chunk({}, "tool_calls"),
        "[DONE]",
    )
    _, reply = stream_reply(openai, raw)
    assert reply.message.tool_calls == (
        ToolCall("call_a", "get_weather", {}, json.dumps(['{"city": ', 5, "}"])),
    )


def test_openai_usage_maps_and_missing_total_is_computed():
    """The usage chunk maps to Usage; a missing total is prompt + completion."""
    usage = {"choices": None, "usage": {"prompt_tokens": 3, "completion_tokens": 4}}
    raw = openai_sse(oa_chunk({"content": "x"}, "stop"), usage, "[DONE]")
    _, reply = stream_reply(openai, raw)
    assert reply.usage == Usage(3, 4, 7)


def test_openai_running_usage_keeps_the_last_totals():
    """Servers that send usage on every chunk send running totals; the last one counts."""
    raw = openai_sse(
        oa_chunk({"content": "a"}, usage={"prompt_tokens": 3, "completion_tokens": 1}),
        oa_chunk({"content": "b"}, "stop", usage={"prompt_tokens": 3, "completion_tokens": 2}),
        "[DONE]",
    )
    _, reply = stream_reply(openai, raw)
    assert reply.usage == Usage(3, 2, 5)


def test_openai_without_usage_reports_zero():
    """No usage chunk (a server that ignores include_usage) is zero usage, not a failure."""
    _, reply = stream_reply(openai, openai_sse(oa_chunk({"content": "x"}, "stop"), "[DONE]"))
    assert reply.usage == Usage()


def test_openai_only_choice_zero_is_the_reply():
    """With n > 1, deltas of other choices are neither yielded nor assembled."""
    other = oa_chunk({"content": "other"})
    other["choices"][0]["index"] = 1
    raw = openai_sse(oa_chunk({"content": "mine"}), other, oa_chunk({}, "stop"), "[DONE]")
    deltas, reply = stream_reply(openai, raw)
    assert deltas == [TextDelta("mine")]
    assert reply.message.text == "mine"


def test_openai_finish_reason_without_done_is_a_complete_reply():
    """The model's finish_reason ends the reply even if a proxy drops [DONE]."""
    _, reply = stream_reply(openai, openai_sse(oa_chunk({"content": "x"}, "length")))
    assert reply.message.text == "x"
    assert reply.stop_reason == "length"


@pytest.mark.parametrize(
    ("error", "status"),
    [
        ({"message": "The server had an error", "type": "server_error", "code": None}, 500),
        ({"message": "slow down", "type": "requests", "code": 429}, 429),
        ({"message": "unavailable", "code": "503"}, 503),
        ({"message": "slow down", "code": "rate_limit_exceeded"}, 500),
        ({"message": "odd", "code": 1234}, 500),
        ({"message": "bad call", "code": "tool_use_failed", "status_code": 400}, 400),
        ({"message": "odd", "code": "x", "status_code": "not a status"}, 500),
        ("a bare string", 500),
    ],
)
def test_openai_error_chunk_raises_provider_error(error: Any, status: int):
    """A mid-stream {"error": ...} chunk is a ProviderError with its status, body and url."""
    body = json.dumps({"error": error})
    raw = openai_sse(oa_chunk({"content": "par"}), body, "[DONE]")
    decoder = openai()
    with pytest.raises(ProviderError) as caught:
        drive(decoder, raw, 5)
    assert caught.value.status == status
    assert caught.value.body == body
    assert caught.value.url == OPENAI_URL
    with pytest.raises(ProtocolError):
        decoder.finish()  # the text before the error is no reply


@pytest.mark.parametrize(
    "cut",
    [
        openai_sse(oa_chunk({"content": "Hel"}), oa_chunk({"content": "lo"})),
        openai_sse(oa_call(0, '{"city": "Os', "call_a", "get_weather")),
        openai_sse(oa_chunk({"content": "Hel"})) + b'data: {"choices": [{"index": 0, "fin',
        b"",
    ],
    ids=["between-events", "mid-tool-call", "mid-event", "empty"],
)
def test_openai_truncated_stream_never_becomes_a_reply(cut: bytes):
    """Without [DONE] or a finish_reason, finish() raises ProtocolError."""
    for size in CHUNK_SIZES:
        decoder = openai()
        drive(decoder, cut, size)
        assert not decoder.done
        with pytest.raises(ProtocolError, match=r"stream ended before \[DONE\]"):
            decoder.finish()


def test_openai_events_after_done_are_refused():
    """Nothing may follow [DONE]."""
    decoder = openai()
    drive(decoder, openai_sse(oa_chunk({"content": "x"}, "stop"), "[DONE]"), 100)
    assert decoder.done
    with pytest.raises(ProtocolError, match=r"after \[DONE\]"):
        decoder.feed(SSEEvent(data=json.dumps(oa_chunk({"content": "late"}))))


def test_openai_bad_json_names_the_event():
    """Data that is not JSON raises ProtocolError naming the event, and ends the decoder."""
    decoder = openai()
    raw = openai_sse(oa_chunk({"content": "x"})) + b'data: {"choices": [\n\n'
    with pytest.raises(ProtocolError, match=r"event #2 \('message'\) data is not JSON"):
        drive(decoder, raw, 3)
    with pytest.raises(ProtocolError):
        decoder.feed(SSEEvent(data="[DONE]"))
    with pytest.raises(ProtocolError):
        decoder.finish()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("[1, 2]", "must be an object"),
        ('{"choices": {}}', "choices must be a list"),
        ('{"choices": [{"index": 0, "delta": {"content": 5}}]}', "content must be"),
        ('{"choices": [{"index": 0, "delta": {"tool_calls": [{"id": "x"}]}}]}', "'index'"),
    ],
)
def test_openai_malformed_chunks_raise_protocol_error(data: str, message: str):
    """A chunk of the wrong shape is a ProtocolError saying what is wrong."""
    with pytest.raises(ProtocolError, match=message):
        openai().feed(SSEEvent(data=data))


def test_openai_tool_call_without_a_name_is_refused():
    """A call the model never named cannot be executed: ProtocolError."""
    decoder = openai()
    fragment = {"index": 0, "id": "c", "function": {"arguments": "{}"}}
    drive(decoder, openai_sse(oa_chunk({"tool_calls": [fragment]}, "tool_calls"), "[DONE]"), 9)
    with pytest.raises(ProtocolError, match="tool call at index 0 has no function name"):
        decoder.finish()


def test_openai_streamed_call_without_an_id_gets_the_id_the_unstreamed_codec_gives():
    """An empty or missing id (Gemini sends "") is derived from the reply, the same way
    streamed or not; two such calls of one reply get different ids."""
    fragments = [
        {"index": 0, "id": "", "function": {"name": "f", "arguments": "{}"}},
        {"index": 1, "function": {"name": "f", "arguments": "{}"}},
    ]
    raw = openai_sse(oa_chunk({"tool_calls": fragments}, "tool_calls"), "[DONE]")
    _, reply = stream_reply(openai, raw)
    first, second = reply.message.tool_calls
    assert first.id.startswith("call_") and second.id.startswith("call_")
    assert first.id != second.id
    unstreamed = OpenAICodec().decode(
        {
            "id": "chatcmpl-1",
            "choices": [
                {
                    "message": {
                        "tool_calls": [
                            {"id": "", "function": {"name": "f", "arguments": "{}"}},
                            {"function": {"name": "f", "arguments": "{}"}},
                        ]
                    }
                }
            ],
        }
    )
    assert unstreamed.message.tool_calls == reply.message.tool_calls


# --- anthropic ------------------------------------------------------------------------------


def test_anthropic_text_stream_yields_deltas_and_the_same_reply_as_unstreamed():
    """Text arrives piece by piece; the reply equals the unstreamed decode, cache included."""
    deltas, reply = stream_reply(anthropic, anthropic_sse(*A_TEXT_EVENTS))
    assert deltas == [TextDelta("Hel"), TextDelta("lo, wörld 🌍")]
    unstreamed = AnthropicCodec().decode(
        {
            "model": "claude-x",
            "content": [{"type": "text", "text": "Hello, wörld 🌍"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 25, "cache_read_input_tokens": 5, "output_tokens": 15},
        }
    )
    assert reply == unstreamed
    assert reply.usage == Usage(30, 15, 45, cache_read_tokens=5)


def test_anthropic_text_then_two_tool_uses_with_json_split_mid_token():
    """A text block, then two tool_use blocks whose partial_json is cut inside tokens."""
    events = [
        a_start(40),
        a_block(0, {"type": "text", "text": ""}),
        a_text(0, "Checking."),
        a_stop(0),
        anthropic_tool_use(1, "toolu_a"),
        a_json(1, ""),
        a_json(1, '{"ci'),
        a_json(1, 'ty": "Os'),
        a_json(1, 'lo"}'),
        a_stop(1),
        PING,
        anthropic_tool_use(2, "toolu_b"),
        a_json(2, '{"city": "Ro'),
        a_json(2, 'me", "da'),
        a_json(2, 'ys": 2}'),
        a_stop(2),
        *a_end("tool_use", 60),
    ]
    deltas, reply = stream_reply(anthropic, anthropic_sse(*events))
    assert deltas[0] == TextDelta("Checking.")
    # The arguments' pieces, as they came (an empty one is no piece), by content block.
    assert deltas[1:] == [
        ArgumentsDelta("get_weather", piece, index)
        for index, piece in [
            (1, '{"ci'),
            (1, 'ty": "Os'),
            (1, 'lo"}'),
            (2, '{"city": "Ro'),
            (2, 'me", "da'),
            (2, 'ys": 2}'),
        ]
    ]
    assert reply.message.text == "Checking."
    assert reply.message.tool_calls == (
        ToolCall("toolu_a", "get_weather", {"city": "Oslo"}),
        ToolCall("toolu_b", "get_weather", {"city": "Rome", "days": 2}),
    )
    assert reply.stop_reason == "tool_use"
    assert reply.usage == Usage(40, 60, 100)


def test_anthropic_tool_use_without_deltas_and_with_bad_json():
    """No input_json_delta keeps the start's input; invalid JSON is kept as invalid_arguments."""
    events = [
        a_start(),
        anthropic_tool_use(0, "toolu_a"),
        a_stop(0),
        anthropic_tool_use(1, "toolu_b"),
        a_json(1, '{"city": Oslo'),
        a_stop(1),
        *a_end("tool_use", 9),
    ]
    _, reply = stream_reply(anthropic, anthropic_sse(*events))
    assert reply.message.text is None
    assert reply.message.tool_calls == (
        ToolCall("toolu_a", "get_weather", {}),
        ToolCall("toolu_b", "get_weather", {}, '{"city": Oslo'),
    )


def test_anthropic_thinking_is_reasoning_and_unknown_events_pass():
    """Thinking is handed out as reasoning, never as text; events the loop cannot act on
    pass silently, as the API's policy asks."""
    events = [
        a_start(),
        a_block(0, {"type": "thinking", "thinking": ""}),
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "hmm"},
        },
        a_stop(0),
        {"type": "some_future_event", "stuff": 1},
        a_block(1, {"type": "text", "text": ""}),
        a_text(1, "ok"),
        a_stop(1),
        *a_end("end_turn", 3),
    ]
    deltas, reply = stream_reply(anthropic, anthropic_sse(*events))
    assert deltas == [ReasoningDelta("hmm"), TextDelta("ok")]
    assert reply.message.text == "ok"
    assert reply.message.reasoning == (Reasoning("hmm"),)  # no signature_delta came


def test_anthropic_message_delta_output_tokens_are_cumulative():
    """Two message_delta events: the last output count stands, it is not added twice."""
    events = [
        a_start(10),
        a_block(0, {"type": "text", "text": ""}),
        a_text(0, "x"),
        a_stop(0),
        {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 4}},
        *a_end("end_turn", 7),
    ]
    _, reply = stream_reply(anthropic, anthropic_sse(*events, eol="\n"))
    assert reply.usage == Usage(10, 7, 17)


@pytest.mark.parametrize(
    ("error_type", "status"),
    [
        ("overloaded_error", 529),
        ("rate_limit_error", 429),
        ("api_error", 500),
        ("authentication_error", 401),
        ("permission_error", 403),
        ("not_found_error", 404),
        ("invalid_request_error", 400),
        ("request_too_large", 413),
        ("billing_error", 402),
        ("timeout_error", 504),
        ("brand_new_error", 500),
    ],
)
def test_anthropic_error_event_raises_provider_error_with_mapped_status(
    error_type: str, status: int
):
    """An `event: error` mid-stream is a ProviderError with the HTTP status of its type."""
    error = {"type": "error", "error": {"type": error_type, "message": "Overloaded"}}
    raw = anthropic_sse(
        a_start(), a_block(0, {"type": "text", "text": ""}), a_text(0, "par"), error
    )
    decoder = anthropic()
    with pytest.raises(ProviderError) as caught:
        drive(decoder, raw, 4)
    assert caught.value.status == status
    assert caught.value.body == json.dumps(error)
    assert caught.value.url == ANTHROPIC_URL
    with pytest.raises(ProtocolError):
        decoder.finish()


@pytest.mark.parametrize("error_type", [["overloaded_error"], {"t": 1}, 529])
def test_anthropic_error_event_with_a_type_that_is_no_string_is_a_protocol_error(
    error_type: object,
):
    """An error type that is not a name (a list cannot even be looked up) is malformed."""
    data = json.dumps({"type": "error", "error": {"type": error_type, "message": "x"}})
    with pytest.raises(ProtocolError, match=r"error\.type must be a string"):
        anthropic().feed(SSEEvent("error", data))


@pytest.mark.parametrize(
    "cut",
    [
        anthropic_sse(*A_TEXT_EVENTS[:-1]),
        anthropic_sse(*A_TEXT_EVENTS[:4]),
        anthropic_sse(*A_TEXT_EVENTS[:-1])
        + b'event: message_stop\r\ndata: {"type": "message_stop"}\r\n',
        b"",
    ],
    ids=["before-message-stop", "mid-text", "stop-without-blank-line", "empty"],
)
def test_anthropic_truncated_stream_never_becomes_a_reply(cut: bytes):
    """Without message_stop, finish() raises ProtocolError, however the bytes were cut."""
    for size in CHUNK_SIZES:
        decoder = anthropic()
        drive(decoder, cut, size)
        with pytest.raises(ProtocolError, match="stream ended before message_stop"):
            decoder.finish()


def test_anthropic_events_after_message_stop_are_refused():
    """Nothing may follow message_stop."""
    decoder = anthropic()
    drive(decoder, anthropic_sse(*A_TEXT_EVENTS), 50)
    assert decoder.done
    with pytest.raises(ProtocolError, match="after message_stop"):
        decoder.feed(SSEEvent("ping", json.dumps(PING)))


def test_anthropic_bad_json_names_the_event():
    """Data that is not JSON raises ProtocolError naming the event type."""
    raw = anthropic_sse(a_start()) + b'event: content_block_delta\ndata: {"index": 0,\n\n'
    with pytest.raises(ProtocolError, match=r"\('content_block_delta'\) data is not JSON"):
        drive(anthropic(), raw, 6)


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([a_block(0, {"type": "text", "text": ""})], "before message_start"),
        ([a_start(), a_text(0, "x")], "no started content block at index 0"),
        ([a_start(), a_start()], "a second message_start"),
        ([a_start(), a_block(0, {"type": "text"}), a_block(0, {"type": "text"})], "started twice"),
        ([a_start(), a_block(0, {"type": "text"}), a_stop(0), a_text(0, "x")], "after its"),
        ([a_start(), anthropic_tool_use(0, "t"), a_text(0, "x")], "text_delta needs a text block"),
        ([a_start(), a_block(0, {"type": "text"}), a_json(0, "{")], "needs a tool block"),
        ([a_start(), a_block(0, {"type": "tool_use", "name": "f"})], "string id and name"),
        ([{"type": "message_stop"}], "before message_start"),
    ],
)
def test_anthropic_out_of_order_or_malformed_events_raise_protocol_error(
    events: list[dict[str, Any]], message: str
):
    """Events that break the documented order or shape are refused, naming the problem."""
    with pytest.raises(ProtocolError, match=message):
        drive(anthropic(), anthropic_sse(*events), 10_000)


def test_anthropic_repeated_tool_use_id_is_refused():
    """Two tool_use blocks with one id cannot both be answered: ProtocolError at finish."""
    events = [
        a_start(),
        anthropic_tool_use(0, "t"),
        a_stop(0),
        anthropic_tool_use(1, "t"),
        a_stop(1),
    ]
    decoder = anthropic()
    drive(decoder, anthropic_sse(*events, *a_end("tool_use", 1)), 10_000)
    with pytest.raises(ProtocolError, match="repeated tool_use id"):
        decoder.finish()
