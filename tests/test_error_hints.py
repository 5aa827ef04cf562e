"""A provider error that a configuration makes likely says the likely fix: a 404 from an
OpenAI-style base_url without /v1, a 401 when no key was given."""

from __future__ import annotations

import pickle

import pytest

from toolnexus_async import LlmClient, ProviderError, Toolkit
from toolnexus_async.testing import MockTransport, json_response

KEY = "sk-hints-test-key-0123456789"


async def failure(
    status: int, base_url: str, style: str = "openai", api_key: str | None = None
) -> ProviderError:
    transport = MockTransport(lambda request: json_response({"error": "nope"}, status=status))
    client = LlmClient(base_url, style=style, model="m", api_key=api_key, transport=transport)
    async with client:
        with pytest.raises(ProviderError) as caught:
            await client.run("hi", Toolkit.create(builtins=False))
    return caught.value


async def test_a_404_without_v1_suggests_adding_it():
    error = await failure(404, "http://127.0.0.1:8000", api_key=KEY)
    assert error.hint is not None
    assert "try base_url='http://127.0.0.1:8000/v1'" in str(error)
    assert str(error).endswith(error.hint)


@pytest.mark.parametrize(
    ("base_url", "style"),
    [
        ("http://127.0.0.1:8000/v1", "openai"),
        ("http://127.0.0.1:8000/v1beta/openai", "openai"),  # Gemini's kind of path
        ("http://127.0.0.1:8000", "anthropic"),  # the client adds /v1 itself
    ],
)
async def test_a_404_with_a_version_in_the_path_has_no_hint(base_url: str, style: str):
    error = await failure(404, base_url, style, api_key=KEY)
    assert error.hint is None and "hint" not in str(error)


@pytest.mark.parametrize(
    ("style", "variable"), [("openai", "OPENAI_API_KEY"), ("anthropic", "ANTHROPIC_API_KEY")]
)
async def test_a_401_without_a_key_names_where_a_key_comes_from(
    monkeypatch: pytest.MonkeyPatch, style: str, variable: str
):
    monkeypatch.delenv(variable, raising=False)
    error = await failure(401, "http://127.0.0.1:8000/v1", style)
    assert error.hint == f"no API key was given: pass api_key=... to LlmClient, or set {variable}"


async def test_a_401_with_a_key_has_no_hint_and_never_shows_the_key():
    error = await failure(401, "http://127.0.0.1:8000/v1", api_key=KEY)
    assert error.hint is None and KEY not in str(error)


def test_the_hint_survives_pickling():
    error = ProviderError(404, "", "u", hint="add /v1")
    again = pickle.loads(pickle.dumps(error))
    assert (again.hint, str(again)) == ("add /v1", str(error))
