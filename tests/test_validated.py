"""veracity/_validated.py: frozen settings validated by pydantic-core alone, as a pydantic
model with the same fields would validate them."""

from __future__ import annotations

import copy
import pickle
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import ValidationError, core_schema

import veracity.config as config
from veracity._validated import Validated, setting
from veracity.bindings import HttpBinding
from veracity.config import Settings, WorkerSettings, parse_duration


class Point(Validated):
    x: int = setting(core_schema.int_schema(ge=0))
    y: int = setting(core_schema.int_schema(), default=0)
    tags: list[str] = setting(core_schema.list_schema(core_schema.str_schema()), factory=list)


def test_construction_validates_and_coerces() -> None:
    p = Point(x="3")
    assert (p.x, p.y, p.tags) == (3, 0, [])
    assert Point.model_fields == ("x", "y", "tags")
    with pytest.raises(ValidationError) as caught:
        Point(x=-1, z=1)
    assert [(e["type"], e["loc"], e["msg"]) for e in caught.value.errors()] == [
        ("greater_than_equal", ("x",), "Input should be greater than or equal to 0"),
        ("extra_forbidden", ("z",), "Extra inputs are not permitted"),
    ]
    with pytest.raises(ValidationError, match="Field required"):
        Point()


def test_a_factory_default_is_new_for_each_instance() -> None:
    a, b = Point(x=1), Point(x=1)
    assert a.tags == b.tags == [] and a.tags is not b.tags


def test_frozen_equal_hashable_and_shown() -> None:
    p = Point(x=1, y=2)
    with pytest.raises(FrozenInstanceError, match="Point is frozen: x cannot be set"):
        p.x = 5
    with pytest.raises(FrozenInstanceError, match="Point is frozen: y cannot be deleted"):
        del p.y
    assert p == Point(x=1, y=2) and p != Point(x=1, y=3) and p != (1, 2)
    assert hash(p) == hash(Point(x=1, y=2))
    assert repr(p) == "Point(x=1, y=2, tags=[])"


def test_model_validate_copy_and_dump() -> None:
    p = Point.model_validate({"x": 4, "tags": ["a"]})
    assert Point.model_validate(p) is p  # an instance passes as it is
    with pytest.raises(ValidationError, match="valid dictionary or instance of Point"):
        Point.model_validate(5)
    # as pydantic's model_copy: the update is not validated
    q = p.model_copy(update={"y": "not checked"})
    unchecked: Any = q.y
    assert (q.x, unchecked, q.tags) == (4, "not checked", ["a"])
    assert (p.y, type(q)) == (0, Point)
    assert p.model_copy() == p and p.model_copy() is not p
    assert p.model_dump() == {"x": 4, "y": 0, "tags": ["a"]}
    dumped = Settings(worker={"concurrency": 7}).model_dump()
    assert dumped["worker"]["concurrency"] == 7 and dumped["http"] == []


def test_copied_and_pickled() -> None:
    s = Settings(worker={"concurrency": 3}, http=[{
        "name": "api", "origin": "http://127.0.0.1:9", "methods": ["GET"]}])
    for again in (copy.copy(s), copy.deepcopy(s), pickle.loads(pickle.dumps(s))):
        assert again == s and again is not s and again.worker.concurrency == 3
        with pytest.raises(FrozenInstanceError):
            again.port = 1


class Point3(Point):
    z: int = setting(core_schema.int_schema(), default=9)


def test_a_subclass_adds_its_fields_after_its_parents() -> None:
    assert Point3.model_fields == ("x", "y", "tags", "z")
    p = Point3(x=1, z="4")
    assert (p.x, p.y, p.z) == (1, 0, 4) and Point.model_fields == ("x", "y", "tags")
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        Point(x=1, z=4)


def test_the_class_keeps_no_default_as_an_attribute() -> None:
    # the declarations are gone from the class: a field is the instance's value only
    assert "y" not in vars(Point) and "concurrency" not in vars(WorkerSettings)


def test_properties_and_nested_settings() -> None:
    s = Settings(worker=WorkerSettings(lease_ttl=8), host="0.0.0.0")
    assert s.worker.effective_heartbeat_interval == 2.0 and s.auth_required
    binding = Settings.model_validate({"http": [{
        "name": "api", "origin": "HTTP://Example.COM", "methods": ["get", "GET", "put"],
        "headers": {"Authorization": "Bearer ${secret:tok}"}}]}).http[0]
    assert isinstance(binding, HttpBinding)
    assert (binding.origin, binding.methods, binding.secrets) == (
        "http://example.com:80", ("GET", "PUT"), ["tok"])


# The same fields as pydantic models: every value below must give the same result, value
# or errors (type, location, message), through both.


def _duration(value: Any) -> Any:
    try:
        return value if value is None else parse_duration(value)
    except ValueError as exc:
        from pydantic_core import PydanticCustomError

        raise PydanticCustomError("duration", "{reason}", {"reason": str(exc)}) from exc


Seconds = Annotated[float, BeforeValidator(_duration)]


class PydanticWorker(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    concurrency: int = Field(default=256, ge=1, le=10000)
    lease_ttl: Seconds = Field(default=120.0, gt=0)
    heartbeat_interval: Seconds | None = Field(default=None, gt=0)
    poll_interval: Seconds = Field(default=1.0, gt=0)
    shutdown_grace: Seconds = Field(default=10.0, ge=0)
    notifications: bool = True
    handoff: bool = True
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_host: str = Field(default="127.0.0.1", min_length=1, max_length=255)

    @field_validator("heartbeat_interval")
    @classmethod
    def _below_ttl(cls, value: float | None, info: ValidationInfo) -> float | None:
        return config._heartbeat_below_ttl(value, info)


class PydanticTop(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    config_path: Path | None = None
    log_level: Annotated[Literal["debug", "info", "warning", "error"],
                         BeforeValidator(lambda v: v.strip().lower() if isinstance(v, str)
                                         else v)] = "info"
    engines: dict[str, dict[str, Any]] = Field(default_factory=dict)
    cron: list[dict[str, Any]] = Field(default_factory=list)


NUMBERS: list[Any] = [0, 1, -1, 5, 65535, 65536, 10001, True, 1.0, 1.5, "1", " 7 ", "1.0",
                      "1_000", "x", "", None, [], {}, 2**70, float("inf"), "90s", "-5s",
                      "1h30m", "500ms", float("nan")]
WORDS: list[Any] = ["a", "", "x" * 256, 1, None, True, b"x", "yes", "off", "TRUE", 2, "1"]


def _outcome(cls: Any, data: dict[str, Any], fields: tuple[str, ...]) -> Any:
    try:
        made = cls.model_validate(data)
    except ValidationError as exc:
        return [(e["type"], e["loc"], e["msg"]) for e in exc.errors()]
    return {name: getattr(made, name) for name in fields}


@pytest.mark.parametrize("field", list(PydanticWorker.model_fields))
def test_worker_settings_validate_as_pydantic_would(field: str) -> None:
    for value in [*NUMBERS, *WORDS]:
        data = {field: value}
        assert _outcome(WorkerSettings, data, WorkerSettings.model_fields) == _outcome(
            PydanticWorker, data, WorkerSettings.model_fields), data
    for data in ({"lease_ttl": 5, "heartbeat_interval": 5}, {"lease_ttl": 0, "x": 1}, {}):
        assert _outcome(WorkerSettings, data, WorkerSettings.model_fields) == _outcome(
            PydanticWorker, data, WorkerSettings.model_fields), data
    assert _outcome(WorkerSettings, {"lease_ttl": 5, "heartbeat_interval": 5}, ()) == [
        ("heartbeat_too_long", ("heartbeat_interval",),
         "must be less than worker.lease_ttl (5s), or leases expire between beats")]


@pytest.mark.parametrize("field", list(PydanticTop.model_fields))
def test_paths_choices_and_tables_validate_as_pydantic_would(field: str) -> None:
    values: list[Any] = [*WORDS, Path("x"), "Debug ", "warning", [{}], [1], {"a": {}},
                         {"a": 1}, {1: {}}, ({},), [{"x": 1}]]
    for value in values:
        data = {field: value}
        mine = _outcome(Settings, data, (field,))
        theirs = _outcome(PydanticTop, data, (field,))
        assert mine == theirs, data
