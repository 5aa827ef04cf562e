"""An MCP server's questions as our requests, and our answers as its responses (sans-IO).

Rules of this module:

- Pure mapping, no I/O: an ``input_required`` result (MCP 2026-07-28) becomes one
  :class:`~toolnexus_async.Request`; an :class:`~toolnexus_async.Answer` becomes the
  ``inputResponses`` the retry sends. An inline question of an older server
  (``elicitation/create`` over the open session) maps the same way.
- Form elicitation is a request of kind ``"input"`` with the JSON Schema the server asked
  for in ``data["schema"]``; URL elicitation is kind ``"authorization"`` with the ``url``
  (as :meth:`ToolResult.auth_required <toolnexus_async.ToolResult.auth_required>`).
- Everything the retry needs travels in ``data["mcp"]``, a plain JSON object, so it
  survives ``Request.to_dict``, a run store and a restart (layout version ``v``, now 1)::

      {"v": 1, "server": "<config name>", "tool": "<the server's tool name>",
       "key": "<the input request's key>", "mode": "form" | "url",
       "state": "<requestState, opaque>" | null}

- One question per request: a result asking several at once, or asking for something
  other than elicitation (sampling, roots: never advertised), is refused with a reason.
- An answer maps to ``accept`` (with ``answer.data`` as the content for a form) when ok,
  to ``decline`` when refused with reason ``"declined"``, and to ``cancel`` otherwise.
  An accepted form's content gets the ``default`` of each property of the schema asked
  with that the answer leaves out (as the protocol asks of clients): a person who left a
  field alone accepted what the form showed.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import attrs
from mcp_types import (
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestParams,
    ElicitRequestURLParams,
    ElicitResult,
    InputRequiredResult,
)

from .._core.types import Answer, Request

__all__ = (
    "INLINE_PREFIX",
    "LAYOUT",
    "Question",
    "elicit_result",
    "inline_request",
    "is_form",
    "question_of",
    "request_for",
    "responses_for",
)

LAYOUT = 1
# The start of an inline question's request id: a host that holds no such question (another
# worker of serve) can tell the person that only the process holding the call can answer.
INLINE_PREFIX = "req_inline_"


@attrs.frozen
class Question:
    """What ``data["mcp"]`` of a suspended MCP call holds."""

    server: str
    tool: str
    key: str
    mode: str
    state: str | None

    def to_data(self) -> dict[str, Any]:
        return {
            "v": LAYOUT,
            "server": self.server,
            "tool": self.tool,
            "key": self.key,
            "mode": self.mode,
            "state": self.state,
        }


def _request(params: ElicitRequestParams, mcp: dict[str, Any] | None) -> Request:
    if isinstance(params, ElicitRequestURLParams):
        data = None if mcp is None else {"mcp": mcp}
        return Request("", "authorization", params.message, url=params.url, data=data)
    schema: dict[str, Any] = dict(params.requested_schema)
    form: dict[str, Any] = {"schema": schema}
    if mcp is not None:
        form["mcp"] = mcp
    return Request("", "input", params.message, data=form)


def request_for(server: str, tool: str, result: InputRequiredResult) -> Request | str:
    """The request asking what ``result`` asks, or why it cannot be asked."""
    asked = result.input_requests or {}
    if len(asked) != 1:
        return (
            f"the server asked {len(asked)} questions at once; "
            "toolnexus_async relays one question per call"
        )
    [(key, wanted)] = asked.items()
    if not isinstance(wanted, ElicitRequest):
        return f"the server asked for {wanted.method}, which this client does not offer"
    params = wanted.params
    mode = "url" if isinstance(params, ElicitRequestURLParams) else "form"
    question = Question(server, tool, key, mode, result.request_state)
    return _request(params, question.to_data())


def inline_request(params: ElicitRequestParams) -> Request:
    """The request for an older server's inline question (nothing to retry: no ``mcp``),
    with an id of its own, :data:`INLINE_PREFIX` and 32 hex digits (a suspension's is given
    by ``ToolResult.pending``)."""
    return attrs.evolve(_request(params, None), id=INLINE_PREFIX + uuid.uuid4().hex)


def question_of(request: Request | None, server: str, tool: str) -> Question | None:
    """The question ``request`` carries for the tool ``tool`` of ``server``, if it does."""
    data = None if request is None else request.data
    mcp = None if data is None else data.get("mcp")
    if not isinstance(mcp, dict) or mcp.get("v") != LAYOUT:
        return None
    if mcp.get("server") != server or mcp.get("tool") != tool:
        return None
    key, mode, state = mcp.get("key"), mcp.get("mode"), mcp.get("state")
    if not isinstance(key, str) or mode not in ("form", "url"):
        return None
    if state is not None and not isinstance(state, str):
        return None
    return Question(server, tool, key, mode, state)


def elicit_result(answer: Answer, *, schema: Mapping[str, Any] | None) -> ElicitResult:
    """The server's view of ``answer``: accept (a form's content, its omitted fields
    filled from the form's ``schema``), decline or cancel. ``schema`` is None for a URL
    question, which has no content."""
    if not answer.ok:
        return ElicitResult(action="decline" if answer.reason == "declined" else "cancel")
    if schema is None:
        return ElicitResult(action="accept")
    content = dict(answer.data or {})
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        for name, spec in properties.items():
            if name not in content and isinstance(spec, Mapping) and "default" in spec:
                content[name] = spec["default"]
    return ElicitResult(action="accept", content=content)


def responses_for(
    question: Question, answer: Answer, request: Request | None
) -> dict[str, ElicitResult]:
    """The ``inputResponses`` of the retry that brings ``answer`` to ``question``, asked
    as ``request`` (whose ``data["schema"]`` has a form's defaults)."""
    schema: Mapping[str, Any] | None = None
    if question.mode == "form":
        data = None if request is None else request.data
        asked = None if data is None else data.get("schema")
        schema = asked if isinstance(asked, Mapping) else {}
    return {question.key: elicit_result(answer, schema=schema)}


def is_form(params: ElicitRequestParams) -> bool:
    return isinstance(params, ElicitRequestFormParams)
