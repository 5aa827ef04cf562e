"""Recorded provider traffic, replayed through the fake provider (no network).

The files under ``tests/recordings/`` are copies, byte for byte, of real traffic that other
projects recorded against the providers; ``tests/recordings/SOURCES.md`` names the origin of
each. :func:`load` turns one file into the replies it holds, in the order the provider sent
them, and :func:`replay` scripts a :class:`~tests.conftest.FakeProvider` with them:

- a pydantic-ai cassette (``.yaml``): every interaction's response, a JSON body
  (``parsed_body``, sent as ``json.dumps`` of it, as pydantic-ai's own replay does) or an
  event stream (``body.string``, sent exactly as recorded), with its recorded status;
- an openai-python Chat Completions body (``.json``) or event stream (``.sse``);
- an anthropic-sdk-python stream fixture (``.txt``), which lacks the line end and blank
  line that end its last event (the SDK's tests feed it line by line): they are added back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import yaml

from toolnexus_async import HttpResponse

RECORDINGS = Path(__file__).resolve().parent / "recordings"


@attrs.frozen
class Recorded:
    """One recorded reply, and the request body that was answered with it (if recorded)."""

    status: int
    content_type: str
    body: bytes
    request: Any = None

    def response(self) -> HttpResponse:
        return HttpResponse(self.status, {"Content-Type": self.content_type}, self.body)

    def json(self) -> Any:
        return json.loads(self.body)


def _content_type(headers: dict[str, Any]) -> str:
    value = headers.get("content-type") or headers.get("Content-Type") or ["application/json"]
    return value[0] if isinstance(value, list) else str(value)


def _from_cassette(path: Path) -> list[Recorded]:
    cassette = yaml.safe_load(path.read_text(encoding="utf-8"))
    out = []
    for interaction in cassette["interactions"]:
        response = interaction["response"]
        if "parsed_body" in response:
            body = json.dumps(response["parsed_body"]).encode()
        else:
            body = response["body"]["string"].encode()
        request = interaction["request"].get("parsed_body")
        ctype = _content_type(response.get("headers") or {})
        out.append(Recorded(response["status"]["code"], ctype, body, request))
    return out


def load(name: str) -> list[Recorded]:
    """The replies recorded in ``tests/recordings/<name>``, in the order they were sent."""
    path = RECORDINGS / name
    if path.suffix == ".yaml":
        return _from_cassette(path)
    raw = path.read_bytes()
    if path.suffix == ".json":
        return [Recorded(200, "application/json", raw)]
    if path.suffix == ".txt":
        raw = raw.rstrip(b"\n") + b"\n\n"
    return [Recorded(200, "text/event-stream", raw)]


def schema(name: str) -> dict[str, Any]:
    """The request schema ``tests/recordings/schemas/<name>.schema.json``."""
    path = RECORDINGS / "schemas" / f"{name}.schema.json"
    value: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return value


def replay(provider: Any, name: str) -> list[Recorded]:
    """Script ``provider`` to answer its requests with the replies of ``name``, in order."""
    recorded = load(name)
    provider.script(*(r.response() for r in recorded))
    return recorded
