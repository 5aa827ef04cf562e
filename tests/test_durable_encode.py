"""What the stores encode: ``Usage.to_dict`` (spelled out, not ``attrs.asdict``) names
every count, and a value that is not JSON (a type the encoder cannot encode, or one that
contains itself) is refused as a PayloadError naming it."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from toolnexus_async import PayloadError, Usage
from toolnexus_async.durable._rows import encode


def test_usage_to_dict_names_every_count() -> None:
    assert Usage(1, 2, 3, 4, 5, 6).to_dict() == {
        "prompt_tokens": 1,
        "completion_tokens": 2,
        "total_tokens": 3,
        "cache_read_tokens": 4,
        "cache_write_tokens": 5,
        "reasoning_tokens": 6,
    }
    # Spelled out by hand: a field added to Usage must be added to to_dict too.
    assert list(Usage().to_dict()) == [field.name for field in attrs.fields(Usage)]


def test_a_value_that_is_not_json_is_refused_by_name() -> None:
    with pytest.raises(PayloadError, match="the thing cannot be stored as JSON"):
        encode({"x": object()}, "the thing")


def test_a_value_that_contains_itself_is_refused_by_name() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = [loop]
    with pytest.raises(PayloadError, match="the loop cannot be stored as JSON"):
        encode(loop, "the loop")
