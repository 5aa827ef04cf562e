"""Argument validation: jsonschema, fastjsonschema and jsonschema-rs on a realistic tool schema.

Run: ``python benchmarks/validation.py [seconds-per-case]``. Prints validations per second
for valid and invalid arguments, and the time to compile the schema once, for:

- ``jsonschema`` (a ``Draft202012Validator`` built once; ``is_valid`` for the verdict, then
  ``best_match(iter_errors)`` only for invalid arguments);
- ``fastjsonschema`` (``compile`` once; the generated function raises on the first error),
  the validator the toolkit used before;
- ``jsonschema-rs`` (``validator_for`` once; ``is_valid``, then the first error's message);
- ``validator_for``: what the toolkit uses, jsonschema-rs plus our own wording of every
  error.

Then the hostile case that decided the change: a ``pattern`` of ``^(a+)+$`` against
``"a" * n + "!"``, the time of one check for growing ``n`` (fastjsonschema runs Python's
backtracking ``re``; the others are bounded).

The schema is the shape models are asked to fill most often: nested objects in an array,
an enum, integer bounds, ``additionalProperties: false`` and an ``anyOf``.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import fastjsonschema
import jsonschema
import jsonschema_rs
from jsonschema.exceptions import best_match

from toolnexus_async._core.validation import validator_for

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "url": {"type": "string", "description": "Where to send it."},
        "format": {"type": "string", "enum": ["text", "markdown", "html"]},
        "timeout": {"type": "integer", "minimum": 1, "maximum": 120},
        "questions": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "question": {"type": "string"},
                    "header": {"type": "string"},
                    "options": {
                        "type": "array",
                        "items": {
                            "anyOf": [
                                {"type": "string"},
                                {
                                    "type": "object",
                                    "properties": {
                                        "label": {"type": "string"},
                                        "description": {"type": "string"},
                                    },
                                    "required": ["label"],
                                },
                            ]
                        },
                    },
                    "multiple": {"type": "boolean"},
                },
                "required": ["question"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["url", "questions"],
    "additionalProperties": False,
}

VALID: dict[str, Any] = {
    "url": "https://example.com/form",
    "format": "markdown",
    "timeout": 30,
    "questions": [
        {"question": "Which colour?", "header": "Colour", "options": ["red", "blue"]},
        {"question": "Ship when?", "options": [{"label": "now"}, {"label": "later"}]},
        {"question": "Anything else?", "multiple": False},
    ],
}

# A typical model mistake, deep in the structure: the last item lacks "question".
INVALID: dict[str, Any] = {
    **VALID,
    "questions": [*VALID["questions"][:2], {"header": "Other"}],
}


def jsonschema_validator() -> Callable[[dict[str, Any]], str | None]:
    validator = jsonschema.Draft202012Validator(SCHEMA)

    def check(args: dict[str, Any]) -> str | None:
        if validator.is_valid(args):
            return None
        error = best_match(validator.iter_errors(args))
        return None if error is None else f"{error.json_path}: {error.message}"

    return check


def fastjsonschema_validator() -> Callable[[dict[str, Any]], str | None]:
    validate = fastjsonschema.compile(SCHEMA)

    def check(args: dict[str, Any]) -> str | None:
        try:
            validate(args)
        except fastjsonschema.JsonSchemaValueException as exc:
            return str(exc.message)
        return None

    return check


def jsonschema_rs_validator() -> Callable[[dict[str, Any]], str | None]:
    validator = jsonschema_rs.validator_for(SCHEMA)

    def check(args: dict[str, Any]) -> str | None:
        if validator.is_valid(args):
            return None
        return next(iter(validator.iter_errors(args))).message

    return check


def rate(check: Callable[[dict[str, Any]], str | None], args: dict[str, Any], secs: float) -> float:
    """Validations per second over about ``secs`` seconds."""
    count = 0
    batch = 200
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < secs:
        for _ in range(batch):
            check(args)
        count += batch
    return count / elapsed


def compile_ms(build: Callable[[], object], rounds: int = 20) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        build()
    return (time.perf_counter() - start) / rounds * 1000


def main() -> None:
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    print(
        f"jsonschema {version('jsonschema')}, fastjsonschema {version('fastjsonschema')},"
        f" jsonschema-rs {version('jsonschema-rs')}"
    )
    print(f"{'library':<16}{'valid/s':>12}{'invalid/s':>12}{'compile ms':>12}  message")
    for label, build in (
        ("jsonschema", jsonschema_validator),
        ("fastjsonschema", fastjsonschema_validator),
        ("jsonschema-rs", jsonschema_rs_validator),
        # A fresh copy each time: validator_for would otherwise answer from its cache.
        ("validator_for", lambda: validator_for(copy.deepcopy(SCHEMA))),
    ):
        check = build()
        assert check(VALID) is None, label
        message = check(INVALID)
        assert message is not None, label
        valid = rate(check, VALID, secs)
        invalid = rate(check, INVALID, secs)
        print(f"{label:<16}{valid:>12,.0f}{invalid:>12,.0f}{compile_ms(build):>12.2f}  {message}")
    hostile()


def hostile() -> None:
    """One check of a hostile argument against a backtracking pattern, by length."""
    schema = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^(a+)+$"}}}
    fast = fastjsonschema.compile(schema)
    ours = validator_for(schema)
    print("pattern ^(a+)+$ against 'a' * n + '!': ms per check")
    print(f"{'n':>6}{'fastjsonschema':>16}{'validator_for':>16}")
    for n in (16, 18, 20, 22):
        args = {"id": "a" * n + "!"}
        start = time.perf_counter()
        try:
            fast(args)
        except fastjsonschema.JsonSchemaValueException:
            pass
        slow = (time.perf_counter() - start) * 1000
        start = time.perf_counter()
        ours(args)
        print(f"{n:>6}{slow:>16.2f}{(time.perf_counter() - start) * 1000:>16.3f}")


if __name__ == "__main__":
    main()
