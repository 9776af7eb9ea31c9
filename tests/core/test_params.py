"""Submitted params against workflow signatures (veracity.core.params)."""

from __future__ import annotations

from typing import Any

import pytest

from veracity.core.params import ParamsShape


async def positional(ctx: Any, order_id: str, cents: int) -> None: ...
async def defaults(ctx: Any, order_id: str, cents: int = 2500, note: str = "") -> None: ...
async def star(ctx: Any, first: str, *rest: int) -> None: ...
async def keyword_default(ctx: Any, order_id: str, *, dry_run: bool = False) -> None: ...
async def keyword_required(ctx: Any, order_id: str, *, region: str) -> None: ...
async def nothing(ctx: Any) -> None: ...
async def only_star(*args: Any) -> None: ...
async def with_kwargs(ctx: Any, a: int, **extra: Any) -> None: ...


def shape(fn: Any) -> ParamsShape:
    found = ParamsShape.of(fn)
    assert found is not None
    return found


@pytest.mark.parametrize(("fn", "params"), [
    (positional, ["o-1", 5]),
    (defaults, ["o-1"]), (defaults, ["o-1", 1]), (defaults, ["o-1", 1, "n"]),
    (star, ["a"]), (star, ["a", 1, 2, 3]),
    (keyword_default, ["o-1"]),
    (nothing, []),
    (only_star, []), (only_star, [1, 2]),
    (with_kwargs, [1]),
], ids=lambda v: getattr(v, "__name__", repr(v)))
def test_params_that_fit(fn: Any, params: list[Any]) -> None:
    assert shape(fn).problem(params) is None


@pytest.mark.parametrize(("fn", "params", "words"), [
    (positional, ["o-1"], ["exactly 2", "(order_id, cents)", "got 1", "missing cents"]),
    (positional, [], ["got 0", "missing order_id, cents"]),
    (positional, ["o-1", 5, 6], ["exactly 2", "got 3"]),
    (defaults, [], ["1 to 3", "cents=2500", "missing order_id"]),
    (defaults, ["o", 1, "n", "extra"], ["1 to 3", "got 4"]),
    (star, [], ["at least 1", "*rest", "missing first"]),
    (keyword_default, ["o-1", True], ["exactly 1", "dry_run=False", "got 2"]),
    (keyword_required, ["o-1"], ["keyword-only", "region"]),
    (keyword_required, ["o-1", "eu"], ["keyword-only", "region"]),
    (nothing, [1], ["exactly 0", "got 1"]),
    (with_kwargs, [], ["missing a"]),
], ids=lambda v: getattr(v, "__name__", repr(v)))
def test_params_that_do_not_fit_say_why(fn: Any, params: list[Any], words: list[str]) -> None:
    problem = shape(fn).problem(params)
    assert problem is not None
    for word in words:
        assert word in problem, (word, problem)


def test_the_context_is_not_a_parameter() -> None:
    s = shape(positional)
    assert s.names == ("order_id", "cents")
    assert s.required == 2 and not s.star_args
    assert "ctx" not in s.text
    assert shape(defaults).required == 1
    assert shape(star).star_args


def test_a_signature_that_cannot_be_read_is_none() -> None:
    class NoSignature:
        @property
        def __signature__(self) -> Any:
            raise ValueError("none")

        def __call__(self, *a: Any) -> None: ...

    assert ParamsShape.of(NoSignature()) is None
