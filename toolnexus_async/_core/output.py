"""A run's typed output: its schema, how the model is asked for it, and how a reply is read.

Rule of this module: pure. :class:`OutputSpec` is a value that travels with the run (and
into its stored JSON, so that a run resumed in another process checks its reply against
the same schema); the loop asks it to read a reply, the codecs ask it how to shape a
request. A reply is valid when it parses as JSON, matches the schema (checked by
:func:`~.validation.validator_for`, the validator of tool arguments) and, when the run was
given a Python type, converts to it.

The three ways of asking (``method``):

- ``"native"``: the provider's structured output (OpenAI's ``response_format`` of type
  ``json_schema``, ``strict`` when the schema allows it; Anthropic's ``output_config``
  ``format``, on the models that support it; Gemini's ``responseJsonSchema``); the
  reply's text is the JSON.
- ``"tool"``: an output tool, :data:`OUTPUT_TOOL`, whose arguments are the value; the
  model is made to call a tool (Anthropic's ``tool_choice: any``, Gemini's mode ``ANY``).
- ``"prompt"``: the schema in the instructions, for servers that support neither; the
  reply's text is read as JSON (a Markdown code fence around it is tolerated).

A schema whose root is not an object (a union, a list, a string) travels wrapped as
``{"result": value}``: providers want an object there, and a tool's input is one.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Literal, TypedDict

import attrs

from .errors import PayloadError, UsageError
from .messages import Message, SystemMessage
from .output_types import Convert, describe
from .validation import validator_for

__all__ = (
    "OUTPUT_TOOL",
    "OutputMethod",
    "OutputOptions",
    "OutputSpec",
    "OutputTool",
    "output_spec",
    "read_options",
    "stored_output",
)

OutputMethod = Literal["native", "tool", "prompt"]
METHODS: tuple[str, ...] = ("native", "tool", "prompt")
OUTPUT_TOOL = "final_result"
WRAP_KEY = "result"
# The method each wire style asks by unless told otherwise.
DEFAULT_METHOD: dict[str, OutputMethod] = {
    "openai": "native",
    "anthropic": "tool",
    "gemini": "native",
    "in-process": "prompt",
}
_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?```$", re.DOTALL)
_NAME = re.compile(r"[^A-Za-z0-9_-]")


class OutputOptions(TypedDict, total=False):
    """The keywords besides ``output_type`` that say how a run asks for its output, as
    every entry takes them (``run``, ``stream``, ``start``, ``ask``, the durable host's):
    written once here, so that no signature spells them again."""

    output_method: str | None
    output_retries: int


def read_options(options: OutputOptions, entry: str) -> tuple[str | None, int]:
    """``(method, retries)`` of an entry's ``**options``.

    Raises:
        TypeError: a keyword that is not one of :class:`OutputOptions`', as Python says of
            an unknown keyword (a misspelt ``output_retry`` must not pass unnoticed).
    """
    for key in options:
        if key not in OutputOptions.__annotations__:
            raise TypeError(f"{entry}() got an unexpected keyword argument {key!r}")
    # Their values are checked where the spec is made (output_spec, OutputSpec).
    return options.get("output_method"), options.get("output_retries", 1)


@attrs.frozen
class OutputTool:
    """The output tool a model is told of in the ``"tool"`` method (a tool spec)."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    source: str = "output"


def _is_object(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") == "object" and not any(
        k in schema for k in ("anyOf", "oneOf", "allOf")
    )


def _closed(node: object) -> bool:
    """Whether every object in ``node`` lists all its properties as required and allows no
    others: what OpenAI's strict mode demands."""
    if isinstance(node, list):
        return all(_closed(item) for item in node)
    if not isinstance(node, dict):
        return True
    if node.get("type") == "object" or "properties" in node:
        properties = node.get("properties")
        if not isinstance(properties, dict) or node.get("additionalProperties") is not False:
            return False
        if set(node.get("required") or ()) != set(properties):
            return False
    return all(_closed(v) for k, v in node.items() if k not in ("enum", "const", "default"))


@attrs.frozen
class OutputSpec:
    """What a run's output must be, and how the model is asked for it.

    Attributes:
        name: the output type's name (``schema["title"]`` or ``"output"`` for a plain
            schema); sent as the schema's name where a provider wants one.
        schema: the JSON Schema of the value.
        method: ``"native"``, ``"tool"`` or ``"prompt"`` (see ``docs/output.md``).
        retries: how many times an invalid reply is sent back to be corrected.
        convert: builds the typed value from validated JSON; ``None`` for a plain schema,
            and for a spec read back from a stored run (its value stays JSON unless the
            type is given again).
    """

    name: str
    schema: dict[str, Any]
    method: OutputMethod
    retries: int = 1
    convert: Convert | None = attrs.field(default=None, eq=False, repr=False)
    wire: dict[str, Any] = attrs.field(init=False, eq=False, repr=False)
    strict: bool = attrs.field(init=False, eq=False, repr=False)
    _told: str = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.method not in METHODS:
            raise UsageError(
                f"output method must be one of {', '.join(METHODS)}, got {self.method!r}"
            )
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise UsageError(f"output_retries must be an int of at least 0, got {self.retries!r}")
        wire = (
            self.schema
            if _is_object(self.schema)
            else {
                "type": "object",
                "properties": {WRAP_KEY: self.schema},
                "required": [WRAP_KEY],
                "additionalProperties": False,
            }
        )
        validator_for(wire)  # a schema that is no JSON Schema is refused now, not mid-run
        object.__setattr__(self, "wire", wire)
        object.__setattr__(self, "strict", _closed(wire))
        # Written once: the prompt method sends it with every request.
        object.__setattr__(
            self,
            "_told",
            "Reply with only a JSON value that matches this JSON Schema, with no text or "
            f"Markdown fence around it:\n\n{json.dumps(wire, separators=(',', ':'))}",
        )

    @property
    def wrapped(self) -> bool:
        """Whether the value travels as ``{"result": value}`` (its schema is no object)."""
        return self.wire is not self.schema

    @property
    def wire_name(self) -> str:
        """The name as providers accept it (``^[A-Za-z0-9_-]{1,64}$``)."""
        return _NAME.sub("_", self.name)[:64] or "output"

    def tool(self) -> OutputTool:
        """The output tool of the ``"tool"`` method."""
        return OutputTool(
            OUTPUT_TOOL,
            f"Call this with the final answer ({self.name}); it ends the conversation.",
            self.wire,
        )

    def shape(
        self, messages: Sequence[Message], tools: Sequence[Any]
    ) -> tuple[Sequence[Message], Sequence[Any]]:
        """A request's transcript and tools, as this method asks: the output tool among
        the tools, or the schema in the instructions (after the run's own). Neither enters
        the transcript, so a stored run asks the same way when it is resumed."""
        if self.method == "tool":
            if any(tool.name == OUTPUT_TOOL for tool in tools):
                raise UsageError(
                    f"a tool is named {OUTPUT_TOOL!r}, the name of the output tool; rename "
                    "it, or use output_method='native' or 'prompt'"
                )
            # A list, not a tuple: the renderers cache tuples (a toolkit's, the same on
            # every request), and a new one per request would push those out.
            return messages, [*tools, self.tool()]
        if self.method == "prompt":
            told = SystemMessage(self.instructions())
            if messages and isinstance(messages[0], SystemMessage):
                return [messages[0], told, *messages[1:]], tools
            return [told, *messages], tools
        return messages, tools

    def instructions(self) -> str:
        """What the ``"prompt"`` method tells the model."""
        return self._told

    def feedback(self, error: str) -> str:
        """What the model is told of an invalid reply."""
        if self.method == "tool":
            return f"Invalid final result: {error}. Call {OUTPUT_TOOL} again, corrected."
        return (
            f"Your reply does not match the required JSON Schema: {error}. "
            "Reply again with only the corrected JSON."
        )

    def read_text(self, text: str) -> tuple[Any, Any, str | None]:
        """``(value, data, None)`` for a valid reply text, ``(None, None, error)`` else."""
        body = text.strip()
        fenced = _FENCE.match(body)
        if fenced is not None:
            body = fenced.group(1).strip()
        try:
            data = json.loads(body)
        except ValueError as exc:
            return None, None, f"the reply is not JSON ({exc})"
        return self.accept(data)

    def accept(self, data: object) -> tuple[Any, Any, str | None]:
        """``(value, data, None)`` when ``data`` (parsed JSON, wrapped or not) is valid,
        ``(None, None, error)`` otherwise; ``data`` comes back unwrapped."""
        if self.wrapped and not (isinstance(data, dict) and set(data) == {WRAP_KEY}):
            data = {WRAP_KEY: data}  # a bare value where the wrapper was asked for: taken
        error = validator_for(self.wire)(data)  # type: ignore[arg-type]
        if error is not None:
            return None, None, error
        if self.wrapped:
            assert isinstance(data, dict)
            data = data[WRAP_KEY]
        if self.convert is None:
            return data, data, None
        try:
            return self.convert(data), data, None
        except (TypeError, ValueError) as exc:
            return None, None, f"the value does not build a {self.name}: {exc}"

    def with_type(self, output_type: object) -> OutputSpec:
        """This spec (its stored schema and method) converting to ``output_type``."""
        _, _, convert = describe(output_type)
        return attrs.evolve(self, convert=convert)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "schema": self.schema,
            "method": self.method,
            "retries": self.retries,
        }

    @classmethod
    def from_dict(cls, payload: object) -> OutputSpec:
        if not isinstance(payload, dict):
            raise PayloadError("run 'output_spec' must be an object")
        name, schema = payload.get("name"), payload.get("schema")
        method, retries = payload.get("method"), payload.get("retries")
        if not isinstance(name, str) or not isinstance(schema, dict):
            raise PayloadError("run 'output_spec' needs a string 'name' and an object 'schema'")
        if method not in METHODS or not isinstance(retries, int) or isinstance(retries, bool):
            raise PayloadError("run 'output_spec' needs a known 'method' and an int 'retries'")
        try:
            return cls(name, schema, method, retries)
        except UsageError as exc:
            raise PayloadError(f"run 'output_spec' is not usable: {exc}") from None


def output_spec(
    output_type: object, *, style: str, method: str | None = None, retries: int = 1
) -> OutputSpec:
    """The spec of ``output_type`` for a run in ``style``; ``method`` None picks the
    style's strongest (native for OpenAI and Gemini, the output tool for Anthropic, the
    prompt for an in-process model).

    Raises:
        UsageError: the type cannot be described, the method is unknown, or the style
            cannot ask that way.
    """
    chosen = method if method is not None else DEFAULT_METHOD.get(style, "prompt")
    if chosen == "native" and style == "in-process":
        raise UsageError(
            "an in-process model has no native structured output; use 'prompt' or 'tool'"
        )
    if chosen not in METHODS:
        raise UsageError(f"output_method must be one of {', '.join(METHODS)}, got {chosen!r}")
    try:
        key: Hashable = (output_type, style, chosen, retries)
        hash(key)
        by_identity = False
    except TypeError:  # a schema dict: by identity, treated as frozen once used
        key, by_identity = (id(output_type), style, chosen, retries), True
    with _lock:
        hit = _specs.get(key)
        # A union (A | B) is a new object each time it is written: equal is enough there.
        if hit is not None and (hit[0] is output_type or not by_identity):
            _specs.move_to_end(key)
            return hit[1]
    name, schema, convert = describe(output_type)
    spec = OutputSpec(name, schema, chosen, retries, convert)  # type: ignore[arg-type]
    with _lock:
        # The type is kept with its spec, so that an id is never reused for another.
        _specs[key] = (output_type, spec)
        while len(_specs) > _REMEMBER:
            _specs.popitem(last=False)
    return spec


# Describing a type and compiling its schema costs several times a run's own overhead: a
# spec is made once per output type, and runs share it (it is frozen).
_REMEMBER = 256
_specs: OrderedDict[Hashable, tuple[object, OutputSpec]] = OrderedDict()
_lock = threading.Lock()


def stored_output(stored: OutputSpec | None, output_type: object) -> OutputSpec | None:
    """The spec a resumed run goes on with: the stored one, building ``output_type`` when
    that is given (a run is validated against the schema it was started with).

    Raises:
        UsageError: ``output_type`` is given for a run that was started without one.
    """
    if output_type is None:
        return stored
    if stored is None:
        raise UsageError(
            "output_type was given to resume a run started without one; a run's output "
            "type is chosen when it starts"
        )
    return stored.with_type(output_type)
