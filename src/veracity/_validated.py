"""Frozen, validated settings classes on pydantic-core alone.

The settings (``veracity.config``) and the ``[[http]]`` entries (``veracity.bindings``) are
read by every command, ``veracity worker`` included. As pydantic models they cost a worker
some 60 ms of its start on a slow machine: pydantic's own modules and building each
model's schema from its annotations. Here each class states its schema in pydantic-core's
terms (``pydantic_core.core_schema``), the validator pydantic itself would build from it:
the same coercions (``"8"`` is the integer 8, ``"yes"`` is true), the same checks and the
same error messages and locations (``pydantic_core.ValidationError``, which is
``pydantic.ValidationError``), without importing pydantic (bench/startup.py measures the
start).

A class lists its fields in order, each ``name: type = setting(schema, default=...)``
(a subclass's after those it inherits); :class:`Validated` builds the validator when the
class is defined. Instances are frozen
(setting a field raises ``dataclasses.FrozenInstanceError``, as a frozen dataclass does);
``Class(**values)`` and ``Class.model_validate(mapping)`` validate, ``model_copy(update=)``
(as pydantic's, it does not validate the update) and ``model_dump()`` are there as on a
pydantic model; instances can be copied and pickled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import FrozenInstanceError
from typing import Any, ClassVar, TypeVar

from pydantic_core import SchemaValidator, core_schema

__all__ = ["Validated", "setting"]

V = TypeVar("V", bound="Validated")

_MISSING: Any = object()


class _Setting:
    __slots__ = ("default", "factory", "schema")

    def __init__(self, schema: core_schema.CoreSchema, default: Any,
                 factory: Callable[[], Any] | None) -> None:
        self.schema = schema
        self.default = default
        self.factory = factory

    def field(self) -> core_schema.ModelField:
        schema = self.schema
        if self.factory is not None:
            schema = core_schema.with_default_schema(schema, default_factory=self.factory)
        elif self.default is not _MISSING:
            schema = core_schema.with_default_schema(schema, default=self.default)
        return core_schema.model_field(schema)


def setting(schema: core_schema.CoreSchema, *, default: Any = _MISSING,
            factory: Callable[[], Any] | None = None) -> Any:
    """A field of a :class:`Validated` class: its schema, and its default (a value, or a
    ``factory`` called for each instance); neither: the field is required."""
    return _Setting(schema, default, factory)


class Validated:
    """A frozen object whose fields are validated when it is made (see the module)."""

    __slots__ = ("__dict__", "__pydantic_extra__", "__pydantic_fields_set__",
                 "__pydantic_private__")
    __validator__: ClassVar[SchemaValidator]
    __core_schema__: ClassVar[core_schema.CoreSchema]
    model_fields: ClassVar[tuple[str, ...]]
    """The fields' names, in order."""
    __settings__: ClassVar[dict[str, _Setting]] = {}
    __pydantic_fields_set__: set[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = {name: value for name, value in vars(cls).items()
               if isinstance(value, _Setting)}
        for name in own:  # the instance's values are its fields, not these
            delattr(cls, name)
        declared = {**cls.__settings__, **own}  # the parent's first
        cls.__settings__ = declared
        cls.model_fields = tuple(declared)
        cls.__core_schema__ = core_schema.model_schema(
            cls,
            core_schema.model_fields_schema(
                {name: s.field() for name, s in declared.items()}, model_name=cls.__name__),
            config=core_schema.CoreConfig(title=cls.__name__, extra_fields_behavior="forbid"),
        )
        cls.__validator__ = SchemaValidator(cls.__core_schema__)

    def __init__(self, **values: Any) -> None:
        type(self).__validator__.validate_python(values, self_instance=self)

    @classmethod
    def model_validate(cls: type[V], values: Any) -> V:
        """An instance from a mapping of field values (or an instance, as it is)."""
        made: V = cls.__validator__.validate_python(values)
        return made

    def model_copy(self: V, *, update: Mapping[str, Any] | None = None) -> V:
        """A copy with ``update``'s values in place (not validated, as pydantic's)."""
        copy = object.__new__(type(self))
        values = {**self.__dict__, **(update or {})}
        object.__setattr__(copy, "__dict__", values)
        object.__setattr__(copy, "__pydantic_fields_set__",
                           self.__pydantic_fields_set__ | set(update or ()))
        object.__setattr__(copy, "__pydantic_extra__", None)
        object.__setattr__(copy, "__pydantic_private__", None)
        return copy

    def model_dump(self) -> dict[str, Any]:
        """The fields as a dict, nested settings as dicts too."""
        return {name: _dumped(value) for name, value in self.__dict__.items()}

    def __getstate__(self) -> dict[str, Any]:
        return {"values": self.__dict__, "set": self.__pydantic_fields_set__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "__dict__", state["values"])
        object.__setattr__(self, "__pydantic_fields_set__", state["set"])
        object.__setattr__(self, "__pydantic_extra__", None)
        object.__setattr__(self, "__pydantic_private__", None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"{type(self).__name__} is frozen: {name} cannot be set")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"{type(self).__name__} is frozen: {name} cannot be deleted")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash((type(self), *(_hashable(v) for v in self.__dict__.values())))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in self.__dict__.items())
        return f"{type(self).__name__}({fields})"


def _dumped(value: Any) -> Any:
    if isinstance(value, Validated):
        return value.model_dump()
    if isinstance(value, list | tuple):
        return type(value)(_dumped(v) for v in value)
    if isinstance(value, dict):
        return {k: _dumped(v) for k, v in value.items()}
    return value


def _hashable(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in value.items())
    return value
