"""JSON text as streampool takes it, from a request body, a batch file's line or a schema given as text:
JSON, no more. Pure, no I/O.

Python's parser takes more than JSON. It reads `NaN`, `Infinity` and `-Infinity`, and a literal past a
float's range (`1e999`) as an infinity; none of them can be written back as JSON (`json.dumps` writes
the bare token `Infinity`, pydantic writes `null`), so they are refused here, before anything is
validated or stored. Nesting is bounded too: the parser and what follows it (validation, the echo of
refused input) recurse once a level, and Python's stack runs out at about 1,000.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_JSON_DEPTH = 128
"""How deeply arrays and objects may nest, the outermost counted as 1: serde_json's default bound;
pydantic's own JSON parser stops at 200, and the deepest part of any request, a structured-output
schema, is held to 64 (shared/constraint_bounds.py)."""

_STRING = r'"(?:[^"\\]|\\.)*+"'
_NESTING = re.compile(_STRING + r"|(?P<open>[\[{])|(?P<close>[\]}])")
_NUMBERS = re.compile(_STRING + r"|(?P<number>NaN|-?Infinity|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")
"""Tokens of JSON text: a string is passed over whole, so that what it holds is never taken for one."""


class OutsideJSON(json.JSONDecodeError):
    """Text Python's parser would take and this one does not: a number that is not finite, or nesting
    past MAX_JSON_DEPTH."""


class _NotFinite(Exception):
    """Raised by the parser's hooks at a number no JSON number can be; located by `_non_finite`."""


def _constant(name: str) -> float:
    raise _NotFinite


def _finite(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise _NotFinite
    return value


_DECODER = json.JSONDecoder(parse_constant=_constant, parse_float=_finite)
"""Made once: `json.loads` given hooks makes a decoder each call, which costs more than the hooks."""


def loads(data: bytes | str) -> Any:
    """The value of JSON text (bytes in any of JSON's encodings, as `json.loads` reads them);
    `json.JSONDecodeError`, at the offending character, for text that is not JSON, and `OutsideJSON`
    for text that nests deeper than MAX_JSON_DEPTH or holds a number that is not finite."""
    text = data if isinstance(data, str) else data.decode(json.detect_encoding(data), "surrogatepass")
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH:  # fewer cannot nest that deep: no scan
        _check_depth(text)
    try:
        return _DECODER.decode(text)
    except _NotFinite:
        raise _non_finite(text) from None


def _check_depth(text: str) -> None:
    """Refuse text nested deeper than MAX_JSON_DEPTH, before the parser recurses into it."""
    depth = 0
    for token in _NESTING.finditer(text):
        if token["open"]:
            depth += 1
            if depth > MAX_JSON_DEPTH:
                message = f"arrays and objects nest deeper than {MAX_JSON_DEPTH} levels"
                raise OutsideJSON(message, text, token.start())
        elif token["close"]:
            depth -= 1


def _past_floats(literal: str | None) -> bool:
    """Whether a number literal is one the parser reads as a float that is not finite (an integer it
    reads exactly, however long)."""
    return literal is not None and not literal.lstrip("-").isdigit() and not math.isfinite(float(literal))


def _non_finite(text: str) -> OutsideJSON:
    """The error at the first number of `text` that is not finite, which the parser's hooks met."""
    found = (token for token in _NUMBERS.finditer(text) if _past_floats(token["number"]))
    token = next(found)  # the parser met one: everything before it was JSON, tokenized as it read it
    literal = token["number"] if len(token["number"]) <= 40 else token["number"][:40] + "..."
    message = f"{literal} is not a finite number: JSON has no NaN or Infinity, nor numbers past 1.8e308"
    return OutsideJSON(message, text, token.start())
