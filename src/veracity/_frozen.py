"""A faster ``__init__`` for the frozen, slotted dataclasses built on every execution.

A frozen dataclass's own ``__init__`` stores each field with ``object.__setattr__(self,
name, value)`` (plain assignment would meet the frozen class's ``__setattr__``): a global
lookup, an attribute lookup and a generic attribute store, looked up again through the
class for each field. An :class:`veracity.models.Execution` has 34 fields: its
``__init__`` took some 3.6 µs, and a worker, a batch submission of 1,000 and the Python
client's answer of 1,000 make one per execution. :func:`quick_init` gives the class an
``__init__`` with the same parameters, defaults and factories that stores each field
through its slot's own descriptor (``__set__``, bound once; the store builds executions
from rows the same way, ``veracity.store._ops.execution_from``): about half the time. The
instances are the same in every way (equal, the same repr, frozen after ``__init__``);
tests/test_frozen.py compares both ``__init__``\\ s on every class that uses it.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

T = TypeVar("T")

_FACTORY = object()
"""The default of a parameter whose field has a ``default_factory``: call the factory."""


def quick_init(cls: type[T]) -> type[T]:
    """Give the frozen, slotted dataclass ``cls`` the faster ``__init__`` (use above
    ``@dataclass(frozen=True, slots=True)``). The dataclass's own stays at
    ``cls.__init__.dataclass_init``. Refused: a class that is not a frozen, slotted
    dataclass, or one with ``__post_init__``, init-only or ``init=False`` fields (their
    order of work is the dataclass's own to keep)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a frozen, slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has __post_init__: keep the dataclass's __init__")
    fields = dataclasses.fields(cast(Any, cls))
    taken = list(inspect.signature(cls.__init__).parameters)[1:]
    if any(not f.init for f in fields) or taken != [f.name for f in fields]:
        # init=False fields, or InitVar pseudo-fields (which fields() leaves out)
        raise TypeError(f"{cls.__name__} has fields outside __init__ or init-only values")
    names: dict[str, Any] = {"_FACTORY": _FACTORY}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for f in fields:
        names[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default is not dataclasses.MISSING:
            names[f"_default_{f.name}"] = f.default
            param = f"{f.name}=_default_{f.name}"
        elif f.default_factory is not dataclasses.MISSING:
            names[f"_factory_{f.name}"] = f.default_factory
            param = f"{f.name}=_FACTORY"
            body.append(f"    if {f.name} is _FACTORY: {f.name} = _factory_{f.name}()")
        else:
            param = f.name
        (keyword if f.kw_only else positional).append(param)
        body.append(f"    _set_{f.name}(self, {f.name})")
    signature = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    source = f"def __init__({signature}):\n" + "\n".join(body or ["    pass"]) + "\n"
    exec(compile(source, f"<quick_init of {cls.__qualname__}>", "exec"), names)
    init: Callable[..., None] = names["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    init.dataclass_init = cls.__init__  # type: ignore[attr-defined]
    setattr(cls, "__init__", init)  # noqa: B010 - mypy refuses assigning a method
    return cls
