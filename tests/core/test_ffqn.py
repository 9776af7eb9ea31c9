from __future__ import annotations

import pytest

from veracity.core.ffqn import InvalidFfqn, is_cancellable, validate_ffqn


@pytest.mark.parametrize(
    "name",
    ["shop:orders/process.run", "example:service/worker.run-cancellable", "a:b.c/d_e.f-g"],
)
def test_valid(name):
    assert validate_ffqn(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "", "shop", "shop:orders", "shop:orders/process", "Shop:orders/process.run",
        "shop:orders/process.run extra", ":a/b.c", "a:/b.c", "a:b/.c", "a:b/c.",
        "a:b/c.d" + "x" * 600,
    ],
)
def test_invalid(name):
    with pytest.raises(InvalidFfqn):
        validate_ffqn(name)


def test_cancellable_suffix():
    assert is_cancellable("example:service/worker.run-cancellable")
    assert not is_cancellable("example:service/worker.run")
