"""Real Anthropic replies, as they really come: recorded traffic replayed through a real
:class:`LlmClient` over the fake provider (``tests/recordings/``, see SOURCES.md)."""

from __future__ import annotations

import json

from toolnexus_async import LlmClient, RetryPolicy, Toolkit
from toolnexus_async.testing import json_response, sse_response

from .conftest import FakeProvider
from .replay import load

BASIC_STREAM = "anthropic-sdk-python/streaming/fixtures/basic_response.txt"
CACHE = "pydantic-ai/test_anthropic/test_anthropic_cache_real_api.yaml"

# No recording holds a 529; this is the error body Anthropic documents for it.
OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


async def test_overloaded_529_is_retried_by_default_streamed_or_not(provider: FakeProvider):
    """Anthropic's 529 ``overloaded_error``, as an HTTP status or as an error event inside a
    stream, is retried by the default policy (here without its waits); the recorded reply
    that follows is the run's answer."""
    provider.script(
        json_response(OVERLOADED, 529),
        load(CACHE)[1].response(),
        sse_response([("message_start", {"type": "message_start", "message": {}}), OVERLOADED]),
        load(BASIC_STREAM)[0].response(),
    )
    client: LlmClient = provider.client("anthropic", retry=RetryPolicy(base_delay=0))
    async with client, Toolkit.create(builtins=False) as toolkit:
        result = await client.run("What is Python?", toolkit)
        async with client.stream("Hi", toolkit) as stream:
            events = [event async for event in stream]
    assert result.status == "done" and result.text.startswith("Python is a beginner-friendly")
    assert [e.text for e in events if e.kind == "text"] == ["Hello", " there", "!"]
    assert len(provider.requests) == 4
    assert json.loads(json.dumps(provider.bodies[0])) == provider.bodies[1]  # sent again as is
