"""Constraints the grammar compiler would take seconds over are refused by a real gateway process, naming
the parameter, before any job is made (422 on the native route as any invalid field, 400 on OpenAI's);
the bounds themselves are shared/constraint_bounds.py's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from shared.config import DEFAULT_MODEL_DIR
from shared.constraint_bounds import MAX_EXPANSION, grammar_problem, regex_problem, schema_problem
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


@pytest.fixture
async def http(gateway_process: KeyedGateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway_process.base_url, timeout=30) as client:
        yield client


async def _keys(redis_client: aioredis.Redis, gateway: KeyedGateway) -> set[str]:
    return {key async for key in redis_client.scan_iter(match=f"{gateway.settings.key_prefix}:*")}


@pytest.mark.parametrize(("path", "body", "param"), REFUSED, ids=[param for _, _, param in REFUSED])
async def test_a_constraint_too_costly_to_compile_is_refused_by_name_and_makes_no_job(
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
