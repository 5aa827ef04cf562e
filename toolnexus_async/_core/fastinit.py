"""A cheaper ``__init__`` for the frozen attrs classes that every run builds many of.

Rule of this module: the class stays exactly what attrs made it (frozen, slotted, the same
fields, defaults and signature); only how ``__init__`` stores each field changes.

Why: attrs' ``__init__`` for a frozen slotted class binds ``object.__setattr__`` to the new
instance (a method wrapper made per object) and calls it once per field, and each call
looks the field's name up on the type and goes through the generic ``setattr``. A run
builds about 25 such objects and sets about 130 fields.

How, for a class of three fields or more: the instance is moved to the class's *twin*, a
subclass with no slot of its own and object's ``__setattr__``, where storing a field is a
plain ``STORE_ATTR`` that the interpreter writes straight into the slot; then it is moved
back (``self.__class__ = cls``: the two share one layout, so CPython allows it, even with
``__weakref__``). By callgrind (3.11.7, ``ToolCall``'s five fields) a field stored that
way costs about 40 instructions and through the slot's setter about 450; the two moves
cost about 1,400 together, so fewer fields keep the setters: each field goes through its
slot descriptor, called directly (``cls.__dict__[name].__set__``, bound once when the
class is made): no wrapper per object, no lookup, no generic ``setattr``. Nothing outside
``__init__`` (and :func:`builder`'s function) ever sees the twin: what it builds is moved
back before anything can raise, and a subclass of the class (whose layout may differ)
takes the setters too.

:func:`builder` gives the hot paths that have every field at hand (the codecs) a function
that starts on the twin: no ``type.__call__``, no keyword dict, no first move.

Kept because ``benchmarks/instructions.py`` shows it (issue 36; 3.11.7, ``--quick``, two
counts at once, twice): 1,556,631 and 1,555,578 instructions per run without it, 1,514,178
and 1,518,013 with it (2.5 % fewer; the floors of each pair within 0.5 %).
``overhead.py``'s timings cannot tell a change this small from the machine's noise
(docs/performance.md).

What attrs does that this does not reproduce (validators, converters, factories that take
``self``, ``__attrs_pre_init__``, inherited fields, slots that are not fields) is refused
when the class is decorated, so a class either keeps attrs' behaviour or fails at import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import attrs

__all__ = ("builder", "fast_init")

T = TypeVar("T", bound=type)
V = TypeVar("V")

_BUILDERS: dict[type, Callable[..., Any]] = {}

# Swapping the class in and out costs about as much as storing two or three fields through
# their slots (callgrind; see the module's docstring), so a class with fewer fields keeps
# the slots' setters.
_SWAP_FROM = 3

# object's ``__class__`` setter: the frozen class's own ``__setattr__`` refuses it.
_SET_CLASS = object.__dict__["__class__"].__set__


def _twin(cls: type) -> type:
    """A subclass of ``cls`` with its layout (no slot, no ``__dict__`` of its own) and
    object's own ``__setattr__``, so that storing a field is plain ``STORE_ATTR``.

    Both ``__setattr__`` and ``__delattr__`` must be object's: they share one slot of the
    type, and the interpreter calls that slot directly only if neither is Python code.
    """
    namespace = {
        "__slots__": (),
        "__setattr__": object.__setattr__,
        "__delattr__": object.__delattr__,
        "__module__": cls.__module__,
        "__qualname__": f"{cls.__qualname__}._fast_init_twin",
        "__doc__": "Only ever seen inside its class's __init__ (fastinit.py).",
    }
    return type(f"{cls.__name__}._fast_init_twin", (cls,), namespace)


def fast_init(cls: T) -> T:
    """Give the frozen slotted attrs class ``cls`` an equivalent, cheaper ``__init__``.

    Raises:
        TypeError: ``cls`` is not a frozen slotted attrs class, or uses what this does not
            reproduce (see the module's docstring).
    """
    name = cls.__qualname__
    fields = attrs.fields(cls)
    slots = set(cls.__dict__.get("__slots__", ())) - {"__weakref__"}
    if "__setattr__" not in vars(cls) or not slots:  # attrs puts frozen's guard there
        raise TypeError(f"fast_init: {name} is not a frozen slotted attrs class")
    if hasattr(cls, "__attrs_pre_init__"):
        raise TypeError(f"fast_init: {name} has __attrs_pre_init__")
    if slots != {f.name for f in fields}:
        raise TypeError(f"fast_init: {name}'s slots are not exactly its own fields")
    building = _twin(cls)
    namespace: dict[str, Any] = {
        "NOTHING": attrs.NOTHING,
        "type": type,
        "_cls": cls,
        "_building": building,
        "_set_class": _SET_CLASS,
    }
    positional: list[str] = []  # attrs has already refused a required one after a default
    keyword: list[str] = []
    prepare: list[str] = []  # what may raise (a factory), before the class is swapped
    stores: list[tuple[str, str, str]] = []  # (field's name, its descriptor's setter, value)
    for index, field in enumerate(fields):
        if field.validator is not None or field.converter is not None:
            raise TypeError(f"fast_init: {name}.{field.name} has a validator or a converter")
        if field.inherited:
            raise TypeError(f"fast_init: {name}.{field.name} is inherited")
        store = f"_s{index}"
        namespace[store] = cls.__dict__[field.name].__set__
        default = field.default
        made = isinstance(default, attrs.Factory)  # type: ignore[arg-type]
        value: str | None  # the default's expression in the generated code, if any
        if made:
            if default.takes_self:
                raise TypeError(f"fast_init: {name}.{field.name}'s factory takes self")
            namespace[f"_f{index}"] = default.factory
            value = f"_f{index}()"
        elif default is not attrs.NOTHING:
            namespace[f"_d{index}"] = default
            value = f"_d{index}"
        else:
            value = None
        if not field.init:
            if value is not None:  # attrs leaves a field with no init and no default unset
                if made:
                    prepare.append(f"_v{index} = {value}")
                    value = f"_v{index}"
                stores.append((field.name, store, value))
            continue
        alias = field.alias
        if alias in ("self", "NOTHING", "type") or alias.startswith("_"):
            raise TypeError(f"fast_init: {name}.{field.name}'s parameter is named {alias}")
        if made:
            parameter = f"{alias}=NOTHING"
            prepare.append(f"if {alias} is NOTHING: {alias} = {value}")
        else:
            parameter = alias if value is None else f"{alias}={value}"
        stores.append((field.name, store, alias))
        (keyword if field.kw_only else positional).append(parameter)
    body = prepare
    slow = [f"{store}(self, {value})" for _, store, value in stores]
    if len(stores) >= _SWAP_FROM:
        # Plain stores on the mutable twin, then back to the frozen class (the module's
        # docstring); a subclass, whose layout may differ, stores through the slots.
        body.append("if type(self) is _cls:")
        body.append("    _set_class(self, _building)")
        body += [f"    self.{field} = {value}" for field, _, value in stores]
        body += ["    self.__class__ = _cls", "else:", *(f"    {line}" for line in slow)]
    else:
        body += slow
    if hasattr(cls, "__attrs_post_init__"):
        body.append("self.__attrs_post_init__()")
    parameters = ["self", *positional, *(["*", *keyword] if keyword else [])]
    source = f"def __init__({', '.join(parameters)}):\n" + "".join(
        f"    {line}\n" for line in body or ["pass"]
    )
    exec(compile(source, f"<fast_init {cls.__module__}.{name}>", "exec"), namespace)
    init = namespace["__init__"]
    original = vars(cls)["__init__"]
    init.__qualname__ = f"{name}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = dict(getattr(original, "__annotations__", {}))
    init.__doc__ = original.__doc__
    type.__setattr__(cls, "__init__", init)
    _BUILDERS[cls] = _builder(cls, building)
    return cls


def _builder(cls: type, building: type) -> Callable[..., Any]:
    # Every field (init=False ones too) by position: p0, p1, ... never clash with a global.
    names = [f"p{index}" for index in range(len(attrs.fields(cls)))]
    by_field = dict(zip((f.name for f in attrs.fields(cls)), names, strict=True))
    body = ["self = _new(_building)"]
    body += [f"self.{field} = {by_field[field]}" for field in by_field]
    body.append("self.__class__ = _cls")
    if hasattr(cls, "__attrs_post_init__"):
        body.append("self.__attrs_post_init__()")
    body.append("return self")
    source = f"def build({', '.join([*names, '/'])}):\n" + "".join(f"    {line}\n" for line in body)
    namespace: dict[str, Any] = {"_new": object.__new__, "_building": building, "_cls": cls}
    exec(
        compile(source, f"<fast_init builder {cls.__module__}.{cls.__qualname__}>", "exec"),
        namespace,
    )
    built: Callable[..., Any] = namespace["build"]
    built.__qualname__ = f"builder({cls.__qualname__})"
    return built


def builder(cls: type[V]) -> Callable[..., V]:
    """A function that builds ``cls``, a :func:`fast_init` class, from the value of every
    field, positionally in ``attrs.fields`` order (``init=False`` ones too; no defaults,
    no factories): what ``cls(...)`` gives for those values, ``__attrs_post_init__`` and
    its checks included, without ``type.__call__`` and without the first move to the twin.

    For the hot paths only, which have every field at hand: a field added to ``cls``
    makes their calls fail (a missing argument), never silently default.

    Raises:
        TypeError: ``cls`` is not a :func:`fast_init` class.
    """
    try:
        return _BUILDERS[cls]
    except KeyError:
        raise TypeError(f"builder: {cls!r} is not a fast_init class") from None
