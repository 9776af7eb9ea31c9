"""``quick_init`` (veracity/_frozen.py): every class that uses it builds exactly what the
dataclass's own ``__init__`` builds, takes the same arguments, refuses the same mistakes,
and stays frozen."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from veracity._frozen import quick_init
from veracity.client import ClientExecution
from veracity.core.states import Status
from veracity.models import Execution, HistoryEvent, NewExecution, Submitted

AT = datetime(2026, 12, 6, 16, 0, tzinfo=UTC)
ID = uuid.UUID("0190a2c4-1234-7abc-8def-0123456789ab")

REQUIRED: dict[type, dict[str, Any]] = {
    Execution: dict(id=ID, ffqn="a:b/c.d", params=[1], status=Status.PENDING, result=None,
                    error=None, attempt=1, deployment_id="d", parent_id=None,
                    idempotency_key=None, scheduled_at=AT, created_at=AT, updated_at=AT,
                    lease_owner=None, lease_epoch=0, lease_expires_at=None),
    NewExecution: dict(ffqn="a:b/c.d", params=[], deployment_id="d", id=ID),
    HistoryEvent: dict(execution_id=ID, seq=1, kind="pending", at=AT, data={}),
    ClientExecution: dict(id=str(ID), ffqn="a:b/c.d", status="pending"),
}
REQUIRED[Submitted] = dict(execution=Execution(**REQUIRED[Execution]), created=True,
                           request_digest=None)


def _by_dataclass(cls: type, *args: Any, **kwargs: Any) -> Any:
    """An instance built by the dataclass's own ``__init__``."""
    made: Any = object.__new__(cls)
    cls.__init__.dataclass_init(made, *args, **kwargs)  # type: ignore[misc]
    return made


def _every_field(cls: type) -> dict[str, Any]:
    """A value for every field, none of them its default."""
    values = dict(REQUIRED[cls])
    for f in dataclasses.fields(cls):
        if f.name not in values:
            values[f.name] = {"raw": {"x": 1}}.get(f.name, f"v-{f.name}")
    return values


CLASSES = list(REQUIRED)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_the_same_instance_from_keywords_positions_and_defaults(cls: type) -> None:
    for values in (REQUIRED[cls], _every_field(cls)):
        quick = cls(**values)
        slow = _by_dataclass(cls, **values)
        assert quick == slow and repr(quick) == repr(slow)
        for f in dataclasses.fields(cls):
            assert getattr(quick, f.name) == getattr(slow, f.name), f.name
        ordered = [values.get(f.name, getattr(slow, f.name)) for f in dataclasses.fields(cls)]
        assert cls(*ordered) == slow
        assert pickle.loads(pickle.dumps(quick)) == quick
        assert dataclasses.replace(quick, **{next(iter(values)): values[next(iter(values))]}
                                   ) == quick


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_the_same_parameters(cls: type) -> None:
    quick = inspect.signature(cls.__init__).parameters  # type: ignore[misc]
    slow = inspect.signature(cls.__init__.dataclass_init).parameters  # type: ignore[misc]
    assert list(quick) == list(slow)
    for name, param in quick.items():
        assert param.kind == slow[name].kind, name
        assert param.annotation == slow[name].annotation, name
        field = {f.name: f for f in dataclasses.fields(cls)}.get(name)
        if field is not None and field.default_factory is dataclasses.MISSING:
            assert param.default == slow[name].default, name


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_the_same_mistakes_refused(cls: type) -> None:
    required = REQUIRED[cls]
    missing = dict(required)
    missing.pop(next(iter(missing)))
    too_many = [required.get(f.name) for f in dataclasses.fields(cls)] + ["extra"]
    for args, kwargs in (((), missing), ((), {**required, "nope": 1}), (too_many, {})):
        with pytest.raises(TypeError):
            cls(*args, **kwargs)
        with pytest.raises(TypeError):
            _by_dataclass(cls, *args, **kwargs)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_still_frozen(cls: type) -> None:
    made = cls(**REQUIRED[cls])
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, dataclasses.fields(cls)[0].name, None)


def test_a_factory_is_called_for_each_instance() -> None:
    one, two = (ClientExecution(**REQUIRED[ClientExecution]) for _ in range(2))
    assert one.raw == {} and one.raw is not two.raw


def test_classes_it_cannot_serve_are_refused() -> None:
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class PostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class OutsideInit:
        a: int
        b: int = dataclasses.field(init=False, default=0)

    @dataclasses.dataclass(frozen=True, slots=True)
    class InitOnly:
        a: int
        b: dataclasses.InitVar[int]

    for cls in (NoSlots, NotFrozen, PostInit, OutsideInit, InitOnly, int):
        with pytest.raises(TypeError):
            quick_init(cls)


def test_keyword_only_fields_stay_keyword_only() -> None:
    @quick_init
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Keys:
        a: int
        b: int = 2

    assert Keys(a=1) == Keys(a=1, b=2) and Keys(a=1).b == 2
    with pytest.raises(TypeError):
        Keys(1)  # type: ignore[call-arg]
