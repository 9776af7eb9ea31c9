"""The JSON text of a batch of a worker's writes (``json_text``) is exactly what
``json.dumps`` writes: the stored text of a result, an event or a step's value is the same
as before, and what ``json.dumps`` refuses is refused the same way."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from veracity.store._common import json_text


class Text(str):
    pass


class Number(int):
    pass


VALUES: list[Any] = [
    None, True, False, 0, -1, 2**64, -(2**100), 0.1, -0.0, 1e16, 1e-7, 2.5e300,
    float("nan"), float("inf"), float("-inf"), "", "plain", "x\x00y", "\ud800",
    "é and 😀", "\"quoted\" \\ back\nline\t", [], {}, [None, [False, {}]],
    {"owner": "worker-1", "epoch": 3}, {"a": {"b": [1, 2.0, "c"]}}, (1, "two"),
    {1: "int key", 2.5: "float key", False: "bool key", None: "none key"},
    OrderedDict([("z", 1), ("a", 2)]), Text("a str subclass"), Number(7),
    {"k\x00": ["\u2028", "\U0010ffff"]},
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_the_same_text_as_json_dumps(value: Any) -> None:
    assert json_text(value) == json.dumps(value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


@given(json_values)
def test_the_same_text_for_any_json_value(value: Any) -> None:
    assert json_text(value) == json.dumps(value)


@pytest.mark.parametrize("value", [object(), {"a": {1, 2}}, [b"bytes"], {("tuple",): 1}],
                         ids=["object", "set", "bytes", "tuple-key"])
def test_refuses_what_json_dumps_refuses(value: Any) -> None:
    with pytest.raises(TypeError) as dumps:
        json.dumps(value)
    with pytest.raises(TypeError) as ours:
        json_text(value)
    assert str(ours.value) == str(dumps.value)


def test_a_failed_call_leaves_the_next_one_right() -> None:
    with pytest.raises(TypeError):
        json_text({"a": [1, object()]})
    assert json_text({"a": [1, 2]}) == '{"a": [1, 2]}'


def test_a_value_that_contains_itself_is_refused() -> None:
    """The one difference: json.dumps says ValueError, json_text RecursionError (no write
    carries such a value: results and step values went through a JSON round trip)."""
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        json.dumps(loop)
    with pytest.raises(RecursionError):
        json_text(loop)
    assert json_text([loop[:0]]) == "[[]]"  # and the next call is right
