"""A cheaper ``__init__`` for the frozen attrs classes that every run builds many of.

Rule of this module: the class stays exactly what attrs made it (frozen, slotted, the same
fields, defaults and signature); only how ``__init__`` stores each field changes.

Why: attrs' ``__init__`` for a frozen slotted class binds ``object.__setattr__`` to the new
instance (a method wrapper made per object) and calls it once per field, and each call
looks the field's name up on the type and goes through the generic ``setattr``. The
``__init__`` made here calls each field's slot descriptor directly
(``cls.__dict__[name].__set__``, bound once when the class is made): no wrapper per object,
no lookup, no generic ``setattr``. A run builds about 25 such objects and sets about 130
fields. Storing fields plainly would cost less still, but that needs mutable classes, and
these are public values that runs, hooks and the journal share.

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

from typing import Any, TypeVar

import attrs

__all__ = ("fast_init",)

T = TypeVar("T", bound=type)


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
    namespace: dict[str, Any] = {"NOTHING": attrs.NOTHING}
    positional: list[str] = []  # attrs has already refused a required one after a default
    keyword: list[str] = []
    body: list[str] = []
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
                body.append(f"{store}(self, {value})")
            continue
        alias = field.alias
        if alias in ("self", "NOTHING"):
            raise TypeError(f"fast_init: {name}.{field.name}'s parameter is named {alias}")
        if made:
            parameter = f"{alias}=NOTHING"
            body.append(f"{store}(self, {value} if {alias} is NOTHING else {alias})")
        else:
            parameter = alias if value is None else f"{alias}={value}"
            body.append(f"{store}(self, {alias})")
        (keyword if field.kw_only else positional).append(parameter)
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
    return cls
