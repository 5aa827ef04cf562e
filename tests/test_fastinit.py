"""fast_init: the frozen classes built on every run keep attrs' behaviour, with a cheaper
``__init__``; what it cannot reproduce is refused when the class is made."""

from __future__ import annotations

import copy
import inspect
import pickle
import weakref
from types import ModuleType
from typing import Any

import attrs
import pytest

from toolnexus_async._core import http as _http
from toolnexus_async._core import messages as _messages
from toolnexus_async._core import records as _records
from toolnexus_async._core import results as _results
from toolnexus_async._core import types as _types
from toolnexus_async._core import wire as _wire
from toolnexus_async._core.errors import PayloadError
from toolnexus_async._core.fastinit import builder, fast_init
from toolnexus_async._engine import streaming as _streaming

MODULES: tuple[ModuleType, ...] = (
    _http,
    _messages,
    _records,
    _results,
    _streaming,
    _types,
    _wire,
)


def frozen_classes(module: ModuleType) -> list[type]:
    # The public ones say __module__ = "toolnexus_async"; imports from the others repeat.
    return [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and attrs.has(obj) and "__setattr__" in vars(obj)
    ]


DECORATED = list({cls: None for module in MODULES for cls in frozen_classes(module)})

# Values the classes' own checks (__attrs_post_init__) accept; any object does for the rest.
ARGUMENTS: dict[str, tuple[Any, ...]] = {
    "Request": ("req_1", "approval", "Pay 12 EUR?"),
    "Answer": ("req_1", True),
    "ToolResult": ("sent",),
    "ToolContext": (),
}


def twin(cls: type) -> type:
    """The same fields, in the same order, with attrs' own ``__init__``."""
    these = {
        f.name: attrs.field(default=f.default, init=f.init, kw_only=f.kw_only, alias=f.alias)
        for f in attrs.fields(cls)
    }
    return attrs.make_class(cls.__name__, these, frozen=True, slots=True)


def shape(cls: type) -> list[tuple[str, Any, Any]]:
    return [
        (p.name, p.kind, p.default)
        for p in inspect.signature(vars(cls)["__init__"]).parameters.values()
    ]


def arguments_for(cls: type) -> tuple[Any, ...]:
    if cls.__name__ in ARGUMENTS:
        return ARGUMENTS[cls.__name__]
    required = [
        p
        for p in inspect.signature(vars(cls)["__init__"]).parameters.values()
        if p.name != "self" and p.default is inspect.Parameter.empty
    ]
    return tuple(object() for _ in required)


def test_every_frozen_class_of_these_modules_has_it() -> None:
    assert len(DECORATED) >= 20
    for cls in DECORATED:
        assert vars(cls)["__init__"].__code__.co_filename.startswith("<fast_init "), cls


@pytest.mark.parametrize("cls", DECORATED, ids=lambda c: c.__name__)
def test_the_signature_and_the_stored_values_are_attrs_own(cls: type) -> None:
    plain = twin(cls)
    assert shape(cls) == shape(plain)
    args = arguments_for(cls)
    built, expected = cls(*args), plain(*args)
    for field in attrs.fields(cls):
        assert getattr(built, field.name) == getattr(expected, field.name), field.name
    # The class is still frozen, and a factory's value is new for every instance.
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(built, attrs.fields(cls)[0].name, None)
    again = cls(*args)
    for field in attrs.fields(cls):
        if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            assert getattr(again, field.name) is not getattr(built, field.name)


@pytest.mark.parametrize("cls", DECORATED, ids=lambda c: c.__name__)
def test_the_twin_path_and_the_slots_path_build_the_same_value(cls: type) -> None:
    # A subclass takes the slots' setters (its layout may differ from the twin's); the
    # class itself is built on its twin and moved back. Both must give the same value.
    sub = type(f"Sub{cls.__name__}", (cls,), {"__slots__": ("extra",)})
    args = arguments_for(cls)
    built, through_slots = cls(*args), sub(*args)
    assert type(built) is cls and type(through_slots) is sub
    for field in attrs.fields(cls):
        assert getattr(built, field.name) == getattr(through_slots, field.name), field.name
    assert weakref.ref(built)() is built
    assert copy.copy(built) == built and repr(copy.copy(built)) == repr(built)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        delattr(built, attrs.fields(cls)[0].name)


# The classes the park and wake path builds through builder() rather than their
# constructors (the codecs, the loop, the model, the transport, the gate, native tools):
# each must be among those whose builder is held to the class below.
BUILT_BY_BUILDER = {
    "AssistantMessage",
    "HttpRequest",
    "HttpResponse",
    "ModelReply",
    "Request",
    "RunResult",
    "ToolCall",
    "ToolCallRecord",
    "ToolResult",
    "ToolReturn",
    "Usage",
    "UserMessage",
}


def test_the_classes_built_by_builder_are_all_held_to_their_constructor() -> None:
    assert BUILT_BY_BUILDER <= {cls.__name__ for cls in DECORATED}


@pytest.mark.parametrize("cls", DECORATED, ids=lambda c: c.__name__)
def test_its_builder_builds_what_the_class_builds(cls: type) -> None:
    # Every field by position, init=False ones too: eq=False fields compared one by one.
    made = cls(*arguments_for(cls))
    values = [getattr(made, f.name, None) for f in attrs.fields(cls)]
    built: Any = builder(cls)(*values)
    assert type(built) is cls and built == made and repr(built) == repr(made)
    for field, value in zip(attrs.fields(cls), values, strict=True):
        assert getattr(built, field.name) is value, field.name
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(built, attrs.fields(cls)[0].name, None)
    assert weakref.ref(built)() is built


def test_a_builder_runs_the_class_checks_and_wants_every_field() -> None:
    with pytest.raises(PayloadError, match=r"ToolResult\.output must be a str"):
        builder(_types.ToolResult)(1, False, None)
    with pytest.raises(TypeError):
        builder(_messages.ToolCall)("c1", "pay", {})  # no invalid_arguments, no wire text
    with pytest.raises(TypeError, match="not a fast_init class"):
        builder(_Base)
    call = builder(_messages.ToolCall)("c1", "pay", {"a": 1}, None, '{"a":1}')
    assert call == _messages.ToolCall("c1", "pay", {"a": 1}) and call._wire_arguments == '{"a":1}'


def test_a_subclass_with_a_dict_keeps_its_class_and_its_values() -> None:
    class Loose(_messages.ToolCall):  # no __slots__: a __dict__, another layout
        pass

    call = Loose("c1", "pay", {"amount": 12})
    assert type(call) is Loose
    assert (call.id, call.name, call.arguments) == ("c1", "pay", {"amount": 12})
    assert repr(call) == repr(_messages.ToolCall("c1", "pay", {"amount": 12})).replace(
        "ToolCall(", "Loose("
    )


@fast_init
@attrs.frozen
class Sample:
    a: int
    b: list[int] = attrs.field(factory=list)
    _c: str = "c"
    d: int = attrs.field(default=4, init=False)
    e: int | None = attrs.field(default=None, kw_only=True)
    f: int = attrs.field(kw_only=True)
    g: int = attrs.field(init=False)  # no default, no init: attrs leaves it unset

    def __attrs_post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a must be >= 0")


def test_aliases_keyword_only_and_fields_without_init() -> None:
    assert shape(Sample) == shape(twin(Sample))
    one = Sample(1, [2], "x", e=5, f=6)
    assert (one.a, one.b, one._c, one.d, one.e, one.f) == (1, [2], "x", 4, 5, 6)
    assert not hasattr(one, "g")
    assert Sample(1, f=0).b == [] and Sample(1, f=0).b is not Sample(1, f=0).b
    with pytest.raises(TypeError):
        Sample(1, [2], "x", 5, 6)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="a must be >= 0"):
        Sample(-1, f=0)


def test_evolve_pickle_and_equality_are_unchanged() -> None:
    call = _messages.ToolCall("c1", "pay", {"amount": 12})
    assert attrs.evolve(call, id="c2") == _messages.ToolCall("c2", "pay", {"amount": 12})
    assert pickle.loads(pickle.dumps(call)) == call
    assert hash(_messages.Usage(1, 2, 3)) == hash(_messages.Usage(1, 2, 3))
    sample = Sample(1, f=2)
    assert attrs.evolve(sample, c="z")._c == "z"


def test_the_classes_own_checks_still_run() -> None:
    with pytest.raises(PayloadError, match=r"ToolResult\.output must be a str"):
        _types.ToolResult(1)  # type: ignore[arg-type]
    with pytest.raises(PayloadError, match=r"ToolContext\.turn"):
        _types.ToolContext(turn="1")  # type: ignore[arg-type]


def _positive(instance: object, attribute: object, value: int) -> None:
    if value < 0:
        raise ValueError


@pytest.mark.parametrize(
    ("define", "why"),
    [
        (lambda: attrs.define(type("Mutable", (), {"__annotations__": {"a": "int"}})), "frozen"),
        (
            lambda: attrs.frozen(slots=False)(type("Dict", (), {"__annotations__": {"a": "int"}})),
            "frozen slotted",
        ),
        (
            lambda: attrs.make_class(
                "Checked", {"a": attrs.field(validator=_positive)}, frozen=True, slots=True
            ),
            "validator",
        ),
        (
            lambda: attrs.make_class(
                "Converted", {"a": attrs.field(converter=int)}, frozen=True, slots=True
            ),
            "converter",
        ),
        (
            lambda: attrs.make_class(
                "Selfish",
                {"a": attrs.field(default=attrs.Factory(lambda self: 1, takes_self=True))},
                frozen=True,
                slots=True,
            ),
            "takes self",
        ),
        (
            lambda: attrs.make_class(
                "Pre", {"a": attrs.field()}, frozen=True, slots=True, bases=(_PreInit,)
            ),
            "__attrs_pre_init__",
        ),
        (
            lambda: attrs.make_class(
                "Child", {"b": attrs.field(default=0)}, frozen=True, slots=True, bases=(_Base,)
            ),
            "slots are not exactly",
        ),
        (
            lambda: attrs.make_class(
                "Odd", {"a": attrs.field(alias="NOTHING")}, frozen=True, slots=True
            ),
            "named NOTHING",
        ),
    ],
)
def test_what_it_cannot_reproduce_is_refused(define: Any, why: str) -> None:
    with pytest.raises(TypeError, match=why):
        fast_init(define())


class _PreInit:
    def __attrs_pre_init__(self) -> None:
        pass


@attrs.frozen
class _Base:
    a: int = 0
