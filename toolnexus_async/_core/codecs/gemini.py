"""The Gemini wire style: Google's Generative Language API, v1beta.

Request: ``POST {base_url}/v1beta/models/{model}:generateContent`` (the version is not
added when the base URL already ends in one), or ``:streamGenerateContent?alt=sse`` for a
streamed reply, with the key in the ``x-goog-api-key`` header. The model is in the URL, not
the body. System messages become ``systemInstruction``; the transcript is ``contents`` of
role ``user`` or ``model`` (consecutive turns of one role are joined, as the API expects),
whose ``parts`` are ``text``, ``functionCall`` and ``functionResponse``. Tools are
``functionDeclarations`` whose ``parametersJsonSchema`` is the tool's JSON Schema as it is.

The results of one turn's calls travel together in one ``user`` turn, in the order of the
calls, each named after its call, with ``{"output": text}`` (``{"error": text}`` for an
error) as its ``response``; the call's ``id`` goes along only when the API gave one (see
:mod:`.gemini_parts` for calls sent without). A reply whose parts carry a
``thoughtSignature`` (which Gemini 3 requires back with its function call) or a server
tool's parts is sent back as it came.

Reply: ``candidates[0].content.parts``, ``usageMetadata``, ``finishReason`` (``STOP``,
``MAX_TOKENS``: ``"max_tokens"``; ``SAFETY`` and the other blocks: a refusal), or a
``promptFeedback.blockReason`` with no candidate (a refusal too). Streamed: every event is a
whole response chunk, and the chunks go to :class:`~.gemini_stream.GeminiStreamDecoder`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from ..errors import ProtocolError
from ..messages import (
    AssistantMessage,
    Message,
    ModelReply,
    SystemMessage,
    ToolReturn,
)
from ..output import OutputSpec
from ._common import obj, provider_error_message
from ._tools import ToolSpec, _Renderer
from .gemini_parts import (
    STYLE,
    gemini_usage,
    is_local_id,
    message_of,
    outcome_of,
    prompt_refusal,
)
from .gemini_stream import GeminiStreamDecoder

__all__ = ("GeminiCodec", "render_gemini_declarations")

API_VERSION = "v1beta"
_VERSION = re.compile(r"v\d+\w*")
# Keys of the body ModelSettings.extra_body merges into ours instead of replacing: its
# generationConfig (temperature, thinkingConfig...) beside the output schema, its tools (a
# googleSearch) after the function declarations.
_MERGED = ("generationConfig", "toolConfig")


def _declaration(tool: ToolSpec) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "parametersJsonSchema": dict(tool.input_schema),
    }


render_gemini_declarations = _Renderer(_declaration)
"""Gemini ``functionDeclarations`` with the tools' JSON Schemas unchanged
(``parametersJsonSchema``)."""


def _response(message: ToolReturn) -> dict[str, Any]:
    part: dict[str, Any] = {
        "name": message.name,
        "response": {"error" if message.is_error else "output": message.output},
    }
    if not is_local_id(message.call_id):
        part["id"] = message.call_id
    return {"functionResponse": part}


def _model_parts(message: AssistantMessage) -> list[dict[str, Any]]:
    wire = message._wire_content
    if wire is not None and wire[0] == STYLE:
        return list(wire[1])
    parts: list[dict[str, Any]] = []
    if message.text:
        parts.append({"text": message.text})
    elif message.refusal:
        parts.append({"text": message.refusal})  # another style's refusal: the model's words
    for call in message.tool_calls:
        sent: dict[str, Any] = {"name": call.name, "args": call.arguments}
        if not is_local_id(call.id):
            sent["id"] = call.id
        parts.append({"functionCall": sent})
    return parts


def _render(messages: Sequence[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    system: list[str] = []
    contents: list[dict[str, Any]] = []
    order: dict[str, int] = {}  # call id -> its position in the last model turn
    results: list[tuple[int, dict[str, Any]]] = []

    def add(role: str, parts: list[dict[str, Any]]) -> None:
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": list(parts)})

    def flush() -> None:
        if results:
            # In the order of the calls: the API pairs a call without an id with its
            # response by name and position.
            add("user", [part for _, part in sorted(results, key=lambda entry: entry[0])])
            results.clear()

    for message in messages:
        if isinstance(message, ToolReturn):
            position = order.get(message.call_id, len(order) + len(results))
            results.append((position, _response(message)))
            continue
        flush()
        if isinstance(message, SystemMessage):
            system.append(message.text)
        elif isinstance(message, AssistantMessage):
            order = {call.id: i for i, call in enumerate(message.tool_calls)}
            parts = _model_parts(message)
            if parts:  # a blocked reply said nothing: no empty turn, which the API refuses
                add("model", parts)
        else:
            add("user", [{"text": message.text}])
    flush()
    return ("\n\n".join(system) if system else None), contents


def _ask_output(
    body: dict[str, Any], config: dict[str, Any], output: OutputSpec, has_tools: bool
) -> None:
    if output.method == "native":
        config["responseMimeType"] = "application/json"
        config["responseJsonSchema"] = output.wire
    elif output.method == "tool":
        # A function must be called; the output tool, among them, ends the run.
        body["toolConfig"] = {"functionCallingConfig": {"mode": "ANY"}}
    elif not has_tools:
        # JSON mode (no schema) beside the schema in the instructions; not with function
        # declarations, which the JSON mode of Gemini 2 models refuses.
        config["responseMimeType"] = "application/json"


def _merge_extra(body: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        mine = body.get(key)
        if key in _MERGED and isinstance(mine, dict) and isinstance(value, dict):
            body[key] = {**mine, **value}
        elif key == "tools" and isinstance(mine, list) and isinstance(value, list):
            body[key] = [*mine, *value]
        else:
            body[key] = value


class GeminiCodec:
    """Encode and decode ``generateContent`` requests and replies."""

    style = STYLE
    key_env = "GEMINI_API_KEY"
    default_base_url = "https://generativelanguage.googleapis.com"

    def endpoint(self, base_url: str) -> str:
        base = base_url.rstrip("/")
        last = base.rsplit("/", 1)[-1]
        return base if _VERSION.fullmatch(last) else f"{base}/{API_VERSION}"

    def url(self, endpoint: str, model: str, stream: bool) -> str:
        name = model if model.startswith(("models/", "tunedModels/")) else f"models/{model}"
        # Quoted: a model name is the user's text, and must not reach the query or path.
        target = f"{endpoint}/{quote(name, safe='/-._~')}"
        return target + (":streamGenerateContent?alt=sse" if stream else ":generateContent")

    def headers(self, api_key: str | None) -> dict[str, str]:
        return {"x-goog-api-key": api_key} if api_key else {}

    def encode(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        *,
        model: str,  # in the URL, not the body
        max_tokens: int | None,
        extra: dict[str, Any] | None = None,
        stream: bool = False,  # in the URL too
        max_tokens_field: str | None = None,  # one name: maxOutputTokens
        output: OutputSpec | None = None,
    ) -> dict[str, Any]:
        system, contents = _render(messages)
        body: dict[str, Any] = {"contents": contents}
        if system is not None:
            body["systemInstruction"] = {"parts": [{"text": system}]}
        if tools:
            body["tools"] = [{"functionDeclarations": render_gemini_declarations(tools)}]
        config: dict[str, Any] = {}
        if max_tokens is not None:
            config["maxOutputTokens"] = max_tokens
        if output is not None:
            _ask_output(body, config, output, bool(tools))
        if config:
            body["generationConfig"] = config
        if extra:
            _merge_extra(body, extra)
        return body

    def stream_decoder(self, url: str) -> GeminiStreamDecoder:
        """A fresh decoder for one streamed reply from ``url`` (named in its errors)."""
        return GeminiStreamDecoder(url)

    def decode(self, payload: object) -> ModelReply:
        payload = obj(payload, "the body", STYLE)
        candidates = payload.get("candidates")
        response_id = payload.get("responseId")
        stop: str | None
        if candidates is None or candidates == []:
            refusal = prompt_refusal(payload.get("promptFeedback"))
            if refusal is None:
                raise ProtocolError(
                    "gemini reply has no candidates[0]" + provider_error_message(payload)
                )
            message, stop = message_of([], response_id, "", refusal), "refusal"
        else:
            if not isinstance(candidates, list):
                raise ProtocolError("gemini reply: candidates must be a list")
            candidate = obj(candidates[0], "candidates[0]", STYLE)
            stop, refusal = outcome_of(candidate.get("finishReason"), candidate)
            message = message_of(
                _parts(candidate), response_id, "candidates[0].content.parts", refusal
            )
        model = payload.get("modelVersion")
        return ModelReply(
            message,
            gemini_usage(payload.get("usageMetadata")),
            model if isinstance(model, str) else None,
            stop,
            raw=payload,
        )


def _parts(candidate: dict[str, Any]) -> list[Any]:
    content = candidate.get("content")
    if content is None:
        return []  # a blocked candidate may have no content at all
    content = obj(content, "candidates[0].content", STYLE)
    parts = content.get("parts")
    if parts is None:
        return []
    if not isinstance(parts, list):
        raise ProtocolError("gemini reply: candidates[0].content.parts must be a list")
    return parts
