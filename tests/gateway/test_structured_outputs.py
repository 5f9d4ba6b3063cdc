"""Constraints the grammar compiler would take seconds over, or that the engine would fail the job for
(nested too deep) or not hold the output to (a `$ref` outside the schema), are refused by a real gateway
process, naming the parameter, before any job is made (422 on the native route as any invalid field, 400
on OpenAI's); the bounds themselves are shared/constraint_bounds.py's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from shared.config import DEFAULT_MODEL_DIR
from shared.constraint_bounds import (
    MAX_EXPANSION,
    MAX_NESTING,
    grammar_problem,
    regex_problem,
    schema_problem,
)
from tests.gateway.keyed_gateway import KeyedGateway

MODEL = DEFAULT_MODEL_DIR.name  # the gateway's default model
SLOW_SCHEMA = {"type": "string", "maxLength": 50_000}  # 2.6 s for xgrammar against SmolLM2's vocabulary

REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/jobs", {"prompt": "Hi", "structured_outputs": {"regex": "(a+)+b"}}, "structured_outputs.regex"),
    ("/v1/jobs", {"prompt": "Hi", "structured_outputs": {"regex": "[^x]{1,20000}"}}, "structured_outputs"),
    (
        "/v1/jobs",
        {"prompt": "Hi", "structured_outputs": {"grammar": 'root ::= "a"{1,99999}'}},
        "structured_outputs.grammar",
    ),
    ("/v1/jobs", {"prompt": "Hi", "structured_outputs": {"json": SLOW_SCHEMA}}, "structured_outputs.json"),
    (
        "/v1/completions",
        {"model": MODEL, "prompt": "Hi", "structured_outputs": {"regex": "(.{0,1000}){1000}"}},
        "structured_outputs",
    ),
    (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SLOW_SCHEMA}},
        },
        "response_format",
    ),
]


DEEP = 5_000
REMOTE_REF = {"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/a.json"}}, "required": ["a"]}
FILE_REF = {"type": "object", "properties": {"a": {"$ref": "file:///etc/passwd"}}, "required": ["a"]}


def nested_schema(levels: int) -> dict[str, Any]:
    """A schema `levels` objects deep: arrays of arrays ... of integers."""
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema


UNSAFE: dict[str, tuple[str, dict[str, Any], str]] = {
    "remote-ref": (
        "/v1/jobs",
        {"prompt": "Hi", "structured_outputs": {"json": REMOTE_REF}},
        "structured_outputs.json",
    ),
    "file-ref-as-text": (
        "/v1/completions",
        {"model": MODEL, "prompt": "Hi", "structured_outputs": {"json": json.dumps(FILE_REF)}},
        "structured_outputs",
    ),
    "file-ref-in-response-format": (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": FILE_REF}},
        },
        "response_format",
    ),
    "remote-ref-in-text-format": (
        "/v1/responses",
        {
            "model": MODEL,
            "input": "Hi",
            "background": True,
            "text": {"format": {"type": "json_schema", "name": "s", "schema": REMOTE_REF}},
        },
        "text.format",
    ),
    "schema-too-deep": (
        "/v1/jobs",
        {"prompt": "Hi", "structured_outputs": {"json": nested_schema(MAX_NESTING + 1)}},
        "structured_outputs.json",
    ),
    "schema-text-too-deep-to-parse": (
        "/v1/jobs",
        {"prompt": "Hi", "structured_outputs": {"json": "[" * 30_000 + "]" * 30_000}},
        "structured_outputs.json",
    ),
    "schema-text-not-finite": (
        "/v1/jobs",
        {"prompt": "Hi", "structured_outputs": {"json": '{"type": "number", "maximum": NaN}'}},
        "structured_outputs.json",
    ),
    "regex-too-deep": (
        "/v1/completions",
        {"model": MODEL, "prompt": "Hi", "structured_outputs": {"regex": "(" * DEEP + "a" + ")" * DEEP}},
        "structured_outputs",
    ),
    "ebnf-too-deep": (
        "/v1/jobs",
        {"prompt": "Hi", "structured_outputs": {"grammar": "root ::= " + "(" * DEEP + '"a"' + ")" * DEEP}},
        "structured_outputs.grammar",
    ),
    "lark-too-deep": (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "structured_outputs": {"grammar": "start: " + "(" * DEEP + '"a"' + ")" * DEEP},
        },
        "structured_outputs",
    ),
}


@pytest.fixture
async def http(gateway_process: KeyedGateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway_process.base_url, timeout=30) as client:
        yield client


async def _keys(redis_client: aioredis.Redis, gateway: KeyedGateway) -> set[str]:
    return {key async for key in redis_client.scan_iter(match=f"{gateway.settings.key_prefix}:*")}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [*REFUSED, *UNSAFE.values()],
    ids=[param for _, _, param in REFUSED] + list(UNSAFE),
)
async def test_a_constraint_too_costly_to_compile_or_unsafe_is_refused_by_name_and_makes_no_job(
    http: httpx.AsyncClient,
    gateway_process: KeyedGateway,
    redis_client: aioredis.Redis,
    path: str,
    body: dict[str, Any],
    param: str,
) -> None:
    before = await _keys(redis_client, gateway_process)
    answer = await http.post(path, json=body)
    assert answer.status_code == (422 if path == "/v1/jobs" else 400), answer.text
    assert param in answer.text and "refused before compiling" in answer.text, answer.text
    assert await _keys(redis_client, gateway_process) == before


async def test_ordinary_constraints_are_taken(http: httpx.AsyncClient) -> None:
    for constraint in (
        {"regex": r"[0-9]{3}-[0-9]{4}"},
        {"regex": r"([a-z]+,)*[a-z]+"},
        {"regex": "(.{0,100}){100}"},
        {"json": {"type": "array", "items": {"type": "string", "maxLength": 64}, "maxItems": 10}},
        {"grammar": 'root ::= "yes" | "no"'},
        {
            "json": {
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/a"}},
                "$defs": {"a": {"type": "integer"}},
            }
        },
        {"json": nested_schema(MAX_NESTING)},
        {"grammar": "start: " + "(" * MAX_NESTING + '"a"' + ")" * MAX_NESTING},
    ):
        answer = await http.post("/v1/jobs", json={"prompt": "Hi", "structured_outputs": constraint})
        assert answer.status_code == 202, (constraint, answer.text)


@pytest.mark.parametrize(
    ("pattern", "refused"),
    [
        ("(a*)*", True),
        ("(?:a+|b+)*", True),
        ("((a|b)+)+", True),
        (r"(\w+\s?)*$", False),  # each repetition holds more than one item
        ("(a+)?", False),
        (f"x{{{MAX_EXPANSION}}}", False),
        (f"x{{{MAX_EXPANSION + 1}}}", True),
        ("((a{10}){10}){101}", True),  # nested counts multiply
        ("[]{]{20000}", True),  # a class holding a brace is one item
        (r"\x{41}{20000}", True),
        ("(?i)(ab){3}", False),
        ("(" * MAX_NESTING + "a" + ")" * MAX_NESTING, False),
        ("(?:" * (MAX_NESTING + 1) + "a" + ")" * (MAX_NESTING + 1), True),
        ("[(]" * (MAX_NESTING + 1), False),  # a parenthesis in a class opens nothing
    ],
)
def test_regex_bounds(pattern: str, refused: bool) -> None:
    assert (regex_problem(pattern) is not None) == refused


def test_schema_and_grammar_counts_are_bounded_wherever_they_are() -> None:
    nested = {"type": "object", "properties": {"a": {"type": "array", "maxItems": MAX_EXPANSION + 1}}}
    assert schema_problem(nested) == f"maxItems {MAX_EXPANSION + 1} is past {MAX_EXPANSION}"
    assert schema_problem({"properties": {"p": {"type": "string", "pattern": "(a+)+"}}}) is not None
    assert schema_problem({"properties": {"pattern": {"type": "string"}}}) is None
    assert grammar_problem('start: "a" ~ 3..50000') is not None
    assert grammar_problem('root ::= "a"{2,5}') is None


DEEPER = MAX_NESTING + 1


@pytest.mark.parametrize(
    ("grammar", "refused"),
    [
        ("root ::= " + "(" * MAX_NESTING + '"a"' + ")" * MAX_NESTING, False),
        ("root ::= " + "(" * DEEPER + '"a"' + ")" * DEEPER, True),
        ("start: " + "[" * DEEPER + '"a"' + "]" * DEEPER, True),  # Lark's optional parts nest
        ("root ::= " + "[(]" * DEEPER + ' "' + "(" * DEEPER + '"', False),  # classes and literals
        ('root ::= "a" # ' + "(" * DEEPER, False),  # a comment
        ('start: "a" // ' + "(" * DEEPER, False),
        ("// root ::= x\nstart: " + "[" * DEEPER + '"a"' + "]" * DEEPER, True),  # Lark: its rule is a comment
        ("start: /" + "(" * DEEPER + "a" + ")" * DEEPER + "/", True),  # a Lark regex's groups
        ('start: /"[^"]*"/ "a"', False),
    ],
)
def test_grammar_groups_nest_at_most_max_nesting_deep(grammar: str, refused: bool) -> None:
    assert (grammar_problem(grammar) is not None) == refused


def test_a_schema_is_self_contained_and_nests_as_deep_as_vllm_takes() -> None:
    """vLLM fails a job whose schema nests objects and arrays deeper than 64 levels; xgrammar reads a
    `$ref` outside the schema as any value, fetching nothing."""
    assert schema_problem(nested_schema(MAX_NESTING)) is None
    assert (
        schema_problem(nested_schema(DEEPER)) == f"objects and arrays nest deeper than {MAX_NESTING} levels"
    )
    assert schema_problem(json.dumps(nested_schema(DEEPER))) is not None
    assert schema_problem("[" * 30_000 + "]" * 30_000) is not None  # past Python's recursion limit
    for reference in ("http://example.com/s.json", "file:///etc/passwd", "other.json#/a"):
        assert "outside the schema" in str(schema_problem({"items": {"$ref": reference}}))
    assert schema_problem({"$ref": "#/$defs/a", "$defs": {"a": {"type": "string"}}}) is None
    assert schema_problem({"properties": {"$ref": {"type": "string"}}}) is None  # a property's name
