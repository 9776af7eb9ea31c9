from __future__ import annotations

import pytest

from veracity.core.ffqn import InvalidFfqn, is_cancellable, validate_ffqn, validate_ffqn_prefix


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


def test_the_length_limit_is_512_characters_inclusive():
    """Guards the length check of validate_ffqn: a name of exactly 512 characters (the
    limit the API's ffqn_prefix filter shares) is accepted, one of 513 is refused with the
    length named."""
    stem = "a:b/c."
    longest = stem + "x" * (512 - len(stem))
    assert len(longest) == 512
    assert validate_ffqn(longest) == longest
    with pytest.raises(InvalidFfqn, match="longer than 512 characters"):
        validate_ffqn(longest + "x")


@pytest.mark.parametrize("text", ["shop:orders/process.run\n", "shop\n"])
def test_a_trailing_newline_is_not_part_of_a_name(text: str) -> None:
    with pytest.raises(InvalidFfqn):
        validate_ffqn(text)
    with pytest.raises(InvalidFfqn):
        validate_ffqn_prefix(text)


@pytest.mark.parametrize("prefix", ["shop", "shop:", "shop:orders", "shop:orders/",
                                    "shop:orders/pro", "shop:orders/process.",
                                    "shop:orders/process.run", "a" * 512])
def test_every_beginning_of_a_name_is_a_valid_prefix(prefix: str) -> None:
    assert validate_ffqn_prefix(prefix) == prefix


@pytest.mark.parametrize(("prefix", "words"), [
    ("", "cannot be empty"),
    ("a" * 513, "longer than 512 characters"),
    ("Shop", "cannot begin a workflow name"),
    (":orders", "cannot begin a workflow name"),
    ("shop:/", "cannot begin a workflow name"),
    ("shop:orders/process.run/", "cannot begin a workflow name"),
])
def test_a_prefix_no_name_begins_with_is_refused_saying_why(prefix: str, words: str) -> None:
    with pytest.raises(InvalidFfqn, match=words):
        validate_ffqn_prefix(prefix)
