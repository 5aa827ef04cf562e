"""Scrubbing keys out of what is shown: whole tokens only, so messages are not mangled, and
a key too short to be real is warned about where the client is built."""

from __future__ import annotations

import warnings

import pytest

from toolnexus_async import LlmClient, ProviderError, Toolkit
from toolnexus_async._core.secrets import Scrubber
from toolnexus_async.testing import MockTransport, json_response


def test_a_short_key_is_scrubbed_as_a_whole_token_only():
    scrub = Scrubber(["k"])
    assert scrub("Name or service not known") == "Name or service not known"
    assert scrub('key=k&model=m; "k"; k.') == 'key=[redacted]&model=m; "[redacted]"; [redacted].'


def test_a_long_key_is_scrubbed_wherever_it_appears():
    """A real key is never left half visible, even run into other characters."""
    key = "sk-0123456789abcdefXYZ"
    scrub = Scrubber([key, "pw"])
    assert scrub(f"bad key {key}; echoed as x{key}y") == (
        "bad key [redacted]; echoed as x[redacted]y"
    )
    assert scrub("pwd pw") == "pwd [redacted]"


def test_a_secret_edged_by_punctuation_is_still_found_next_to_letters():
    """Only an edge that is itself a token character needs a boundary."""
    assert Scrubber(["=ab="])("x=ab=y") == "x[redacted]y"


async def test_a_provider_error_keeps_its_words_with_a_one_letter_key():
    body = {"error": {"message": "Name or service not known for key k"}}
    transport = MockTransport(lambda request: json_response(body, status=400))
    with pytest.warns(UserWarning, match="api_key is 1 characters long, too short"):
        client = LlmClient("http://127.0.0.1:9/v1", model="m", api_key="k", transport=transport)
    async with client:
        with pytest.raises(ProviderError) as caught:
            await client.run("hi", Toolkit.create(builtins=False))
    assert "Name or service not known for key [redacted]" in str(caught.value)


def test_a_short_key_from_the_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "xyz")
    with pytest.warns(UserWarning, match="ANTHROPIC_API_KEY is 3 characters long"):
        LlmClient("http://127.0.0.1:9", style="anthropic", model="m")


def test_a_real_looking_key_and_no_key_are_not_warned_about(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LlmClient("http://127.0.0.1:9/v1", model="m", api_key="sk-test-key")
        LlmClient("http://127.0.0.1:9/v1", model="m")
