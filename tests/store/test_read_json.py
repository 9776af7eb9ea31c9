"""The stores' JSON reader (orjson, with the standard library where orjson reads otherwise)
gives exactly what ``json.loads`` gives: the same values of the same types."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from veracity.store._common import read_json

DOCS = [
    "null", "true", "0", "-0", "-0.0", "1.0", "1E2", "2.5e-8", "0.1",
    "9223372036854775807", "-9223372036854775808", "18446744073709551615",
    "18446744073709551616", "123456789012345678901234567890", "-1180591620717411303424",
    "0.12345678901234567890123", "1e400", "-1e400", "NaN", "Infinity",
    '"plain"', '"x\\u0000y"', '"\\ud800"', '"\\ud83d\\ude00"', '"é and 😀"',
    '{"a": 1, "a": 2}', '{"k\\u0000": [1, 2.0, {"n": 2361183241434822606848}]}',
    '[[], {}, [null, false]]', '  {"spaced" : [ 1 , 2 ] }  ',
]


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) ==
                                                    math.copysign(1, b))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@pytest.mark.parametrize("doc", DOCS)
@pytest.mark.parametrize("as_bytes", [True, False], ids=["bytes", "str"])
def test_reads_as_the_standard_library_does(doc: str, as_bytes: bool) -> None:
    data: bytes | str = doc.encode("utf-8", "surrogatepass") if as_bytes else doc
    expected = json.loads(doc)
    assert same(read_json(data), expected), (doc, read_json(data), expected)


def test_a_long_integer_inside_a_document_stays_an_int() -> None:
    got = read_json(b'{"id": "3f2a", "n": 123456789012345678901234567890, "t": 1.5}')
    assert got == {"id": "3f2a", "n": 123456789012345678901234567890, "t": 1.5}
    assert type(got["n"]) is int
