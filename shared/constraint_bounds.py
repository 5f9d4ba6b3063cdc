"""What a structured-output constraint may ask of the grammar compiler: bounds checked before any job.

A grammar backend compiles a repetition count into as many states, each with its mask over the
vocabulary: against SmolLM2's 49k tokens xgrammar takes 0.4 s for `[a-z]{1,5000}`, 1 s for
`(.{0,100}){100}` and 2 s for `[^x]{1,20000}`, and counts nested in each other multiply.

Nesting is bounded too. vLLM 0.32 fails a job whose schema nests deeper than 64 levels. xgrammar
refuses groups nested past 1,000 levels in a regex or an EBNF grammar and past 200 in a Lark one;
vLLM then falls back to llguidance, which stops at 250 in a regex and 28 in Lark, and whose
conversion of a 5,000-deep EBNF grammar ends in a RecursionError: each a job made, then failed.
A schema's `$ref` outside the schema is no constraint at all: xgrammar reads it as any JSON value
(nothing is fetched), so the output would not be held to what was asked. Pure, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from shared import json_text

MAX_EXPANSION = 10_000
"""The most characters one repeated part of a regex may expand to (counts nested in each other
multiply: `(.{0,100}){100}` is 10,000), and the largest count a grammar or JSON schema may give."""

MAX_NESTING = 64
"""How deep a constraint may nest: a JSON schema's objects and arrays (vLLM's own bound, counted as vLLM
counts them), a regex's groups, a grammar's groups; well within what xgrammar takes of each."""

_COUNT = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_GROUP_FLAGS = re.compile(r"\?(?:[:=!>]|<[=!]|P?<[^>]*>|[a-zA-Z-]*[:)])")
_GRAMMAR_COUNTS = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}|~\s*(\d+)(?:\s*\.\.\s*(\d+))?")
_SCHEMA_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_QUOTED = r"\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'"
_EBNF_TOKENS = re.compile(_QUOTED + r"|\[(?:\\.|[^\]\\])*\]|#[^\n]*|(?P<open>\()|(?P<close>\))")
"""What nests in an EBNF grammar: `(`; quoted text, character classes and `#` comments pass over."""
_LARK_TOKENS = re.compile(
    _QUOTED + r"|//[^\n]*|/(?P<regex>(?:\\.|[^/\\\n])+)/|(?P<open>[(\[])|(?P<close>[)\]])"
)
"""What nests in a Lark grammar: `(` and `[` (an optional part), and the groups of its /regex/ literals;
quoted text and `//` comments pass over."""
_EBNF_RULE = re.compile(r"^(?:(?!#|//).)*::=", re.MULTILINE)
"""A rule of an EBNF grammar, outside a comment: a grammar without one is Lark's, as vLLM tells them apart."""
_GROUPS_TOO_DEEP = f"groups nest deeper than {MAX_NESTING} levels"
_SCHEMA_TOO_DEEP = f"objects and arrays nest deeper than {MAX_NESTING} levels"


@dataclass
class _Group:
    """An open group of a regex as the scan goes through it."""

    size: int = 0  # what the group expands to so far
    last: int = 0  # what its last item expands to, which a quantifier multiplies
    last_is_loop_group: bool = False  # that item is a group of nothing but unbounded repetitions
    items: int = 0  # items in the current alternative
    loops_only: bool = True  # every alternative so far is one unboundedly repeated item
    last_loops: bool = False  # the current alternative's last item repeats without bound

    def add(self, size: int, loop_group: bool = False) -> None:
        self.size += size
        self.last, self.last_is_loop_group = size, loop_group
        self.items, self.last_loops = self.items + 1, False

    def repeat(self, times: int, unbounded: bool) -> None:
        self.size += self.last * (times - 1)
        self.last *= times
        self.last_loops = unbounded

    def alternative(self) -> None:
        self.loops_only = self.loops_only and self.items == 1 and self.last_loops
        self.items, self.last_loops = 0, False

    def closed(self) -> bool:
        """Whether, closed here, the group holds nothing but unbounded repetitions, as `(a+)` does."""
        self.alternative()
        return self.loops_only


def _atom_end(pattern: str, start: int) -> int:
    """Where the atom at `start` (an escape, a character class or one character) ends."""
    if pattern[start] == "\\":
        end = start + 2
        if pattern[start + 1 : start + 2] in ("x", "u", "p", "P", "k") and pattern[end : end + 1] in "{<":
            closing = pattern.find("}" if pattern[end] == "{" else ">", end)
            return len(pattern) if closing < 0 else closing + 1
        return end
    if pattern[start] == "[":
        index = start + 1
        index += pattern[index : index + 1] == "^"
        index += pattern[index : index + 1] == "]"  # a `]` first is a member, not the end
        while index < len(pattern) and pattern[index] != "]":
            index += 2 if pattern[index] == "\\" else 1
        return index + 1
    return start + 1


def _quantifier(pattern: str, index: int) -> tuple[int, bool, int] | None:
    """The quantifier at `index` as (most repetitions, unbounded, where it ends), or None."""
    char = pattern[index]
    if char in "*+?":
        times, unbounded, end = 1, char != "?", index + 1
    elif (count := _COUNT.match(pattern, index)) is not None:
        least, most = count.group(1), count.group(2)
        times, unbounded = int(most or least), most == ""
        end = count.end()
    else:
        return None
    if pattern[end : end + 1] in ("?", "+"):  # lazy or possessive: the same repetitions
        end += 1
    return times, unbounded, end


def regex_problem(pattern: str) -> str | None:
    """Why the gateway refuses `pattern` as a constraint, or None: a repeated part expands past
    MAX_EXPANSION, it repeats a group of unbounded repetitions without bound, as `(a+)+` (the same
    language as `a+`, and the shape that backtracking and DFA-building compilers take exponential time
    over), or its groups nest deeper than MAX_NESTING."""
    groups = [_Group()]
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "(":
            flags = _GROUP_FLAGS.match(pattern, index + 1)
            if flags is None or not flags.group().endswith(")"):  # `(?i)` opens no group
                groups.append(_Group())
                if len(groups) > MAX_NESTING + 1:  # the first is the pattern itself
                    return _GROUPS_TOO_DEEP
            index = index + 1 if flags is None else flags.end()
            continue
        if char == ")" and len(groups) > 1:
            group = groups.pop()
            groups[-1].add(min(group.size, MAX_EXPANSION + 1), loop_group=group.closed())
            index += 1
            continue
        if char == "|":
            groups[-1].alternative()
            index += 1
            continue
        quantifier = _quantifier(pattern, index) if groups[-1].items else None
        if quantifier is not None:
            times, unbounded, index = quantifier
            if unbounded and groups[-1].last_is_loop_group:
                return "nests an unbounded repetition right in another, as (a+)+ does (a+ matches the same)"
            groups[-1].repeat(times, unbounded)
            if times > 1 and groups[-1].last > MAX_EXPANSION:
                return f"repeats a part past {MAX_EXPANSION} characters (nested counts multiply)"
            continue
        groups[-1].add(1)
        index = _atom_end(pattern, index)
    return None


def grammar_problem(grammar: str) -> str | None:
    """Why the gateway refuses an EBNF or Lark grammar: a repetition count (`{n,m}`, `~ n..m`) past
    MAX_EXPANSION, groups nested deeper than MAX_NESTING, or a /regex/ of a Lark grammar that
    `regex_problem` refuses; None when none of these."""
    for match in _GRAMMAR_COUNTS.finditer(grammar):
        counts = [int(count) for count in match.groups() if count]
        if max(counts, default=0) > MAX_EXPANSION:
            return f"repeats {match.group(0)!r}: at most {MAX_EXPANSION} repetitions"
    lark = _EBNF_RULE.search(grammar) is None
    depth = 0
    for token in (_LARK_TOKENS if lark else _EBNF_TOKENS).finditer(grammar):
        if token["open"]:
            depth += 1
            if depth > MAX_NESTING:
                return _GROUPS_TOO_DEEP
        elif token["close"]:
            depth = max(depth - 1, 0)
        elif lark and token["regex"] and (problem := regex_problem(token["regex"])) is not None:
            return f"/{token['regex'][:80]}/ {problem}"
    return None


def _nests_deeper(document: dict[str, Any] | list[Any], levels: int) -> bool:
    """Whether a JSON document's objects and arrays nest deeper than `levels` (the document itself is
    the first), level by level as vLLM counts them: no recursion, however deep it goes."""
    level: list[dict[str, Any] | list[Any]] = [document]
    for _ in range(levels):
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


def _schema_nodes(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _schema_nodes(value)
    elif isinstance(node, list):
        for item in node:
            yield from _schema_nodes(item)


def schema_problem(schema: dict[str, Any] | str) -> str | None:
    """Why the gateway refuses a JSON schema (an object, or its JSON text): objects and arrays nested
    deeper than MAX_NESTING, a `$ref` to anything but a part of the schema itself (`#...`), a length,
    item or property count past MAX_EXPANSION, or a `pattern` that `regex_problem` refuses; None when
    none of these, or for text that is no JSON, which is the engine's to refuse."""
    try:
        document: object = json_text.loads(schema) if isinstance(schema, str) else schema
    except json_text.OutsideJSON as exc:  # nested past any schema's bound, or a number JSON has not
        return exc.msg
    except ValueError:
        return None
    if not isinstance(document, dict | list):
        return None
    if _nests_deeper(document, MAX_NESTING):
        return _SCHEMA_TOO_DEEP
    return next(filter(None, map(_node_problem, _schema_nodes(document))), None)


def _node_problem(node: dict[str, Any]) -> str | None:
    """Why one object of a schema is refused, by its own keywords (not its subschemas'), or None."""
    reference = node.get("$ref")
    if isinstance(reference, str) and not reference.startswith("#"):
        return (
            f"$ref {reference[:80]!r} is outside the schema: only references within it ('#...') are followed"
        )
    for name in _SCHEMA_COUNTS:
        count = node.get(name)
        if isinstance(count, int) and count > MAX_EXPANSION:
            return f"{name} {count} is past {MAX_EXPANSION}"
    patterns = [node.get("pattern")] + list(node.get("patternProperties") or {})
    for pattern in patterns:
        if isinstance(pattern, str) and (problem := regex_problem(pattern)) is not None:
            return f"pattern {pattern[:80]!r} {problem}"
    return None
