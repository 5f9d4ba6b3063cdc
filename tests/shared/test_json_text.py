"""`shared.json_text`: JSON and no more, refused at the offending character."""

from __future__ import annotations

import json

import pytest

from shared.json_text import MAX_JSON_DEPTH, loads

LONG_INTEGER_FIRST = '{"s": "NaN 1e999 [[[", "i": ' + "9" * 400 + ', "x": 1e999}'
"""An integer past a double's range is read exactly, and a string is text: the 1e999 after them is refused."""


@pytest.mark.parametrize(
    ("text", "position", "reason"),
    [
        ('{"a": NaN}', 6, "NaN is not a finite number"),
        ("[1, Infinity]", 4, "Infinity is not a finite number"),
        ('{"b": [0.5, -Infinity]}', 12, "-Infinity is not a finite number"),
        ('{"n": 1E+999}', 6, "1E+999 is not a finite number"),
        ('{"n": -2.5e400}', 6, "-2.5e400 is not a finite number"),
        (LONG_INTEGER_FIRST, LONG_INTEGER_FIRST.rindex("1e999"), "1e999 is not a finite"),
        ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), MAX_JSON_DEPTH, "deeper than"),
        ('{"a": ' * 5_000 + "1" + "}" * 5_000, len('{"a": ') * MAX_JSON_DEPTH, "deeper than"),
    ],
)
def test_what_json_has_not_is_refused_where_it_stands(text: str, position: int, reason: str) -> None:
    with pytest.raises(json.JSONDecodeError) as refused:
        loads(text.encode())
    assert refused.value.pos == position and reason in refused.value.msg


def test_what_strings_hold_is_text_and_numbers_are_read_as_json_reads_them() -> None:
    text = json.dumps({"brackets": "[{" * 1_000, "words": "NaN Infinity 1e999", "quote": '\\"[['})
    assert loads(text)["brackets"] == "[{" * 1_000
    assert loads("[" + "9" * 400 + ", 1e-999, 1.5e308]") == [int("9" * 400), 0.0, 1.5e308]
    deepest = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert loads(deepest) == json.loads(deepest)
    assert loads('{"a": 1}'.encode("utf-16")) == {"a": 1}  # any of JSON's encodings, as json.loads
