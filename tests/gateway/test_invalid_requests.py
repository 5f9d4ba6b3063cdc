"""Bad input gets the documented error, and creates nothing in Redis.

These run the real gateway app in-process against a real Redis of their own, with no
worker: what they check is decided before a job would ever reach one.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from shared.config import Settings
from shared.jobstore import JobStore
from shared.keys import Keys
from tests.conftest import make_settings
from tests.gateway.stand_ins import DELTAS, StandInWorker
from tests.helpers import in_process_gateway, read_sse, submit
from tests.processes import free_port
from tests.redis_cleanup import delete_prefix


@pytest.fixture
async def settings(redis_url: str) -> AsyncIterator[Settings]:
    settings = make_settings(
        redis_url, max_queued_jobs=3, allow_unauthenticated=True, max_body_bytes=MAX_BODY_BYTES
    )
    yield settings
    delete_prefix(redis_url, settings.key_prefix)


MAX_BODY_BYTES = 64 * 1024


async def _keys(redis_client: aioredis.Redis, settings: Settings) -> set[str]:
    return {key async for key in redis_client.scan_iter(match=f"{settings.key_prefix}:*")}


INVALID_BODIES: list[tuple[str, Any]] = [
    ("empty prompt", {"prompt": ""}),
    ("neither prompt nor messages", {"max_tokens": 5}),
    ("both prompt and messages", {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}),
    ("max_tokens zero", {"prompt": "hi", "max_tokens": 0}),
    ("max_tokens above the limit", {"prompt": "hi", "max_tokens": 100_000}),
    ("max_tokens as a string", {"prompt": "hi", "max_tokens": "5"}),
    ("temperature out of range", {"prompt": "hi", "temperature": 3.5}),
    ("top_p zero", {"prompt": "hi", "top_p": 0}),
    ("prompt as a number", {"prompt": 42}),
    ("unknown field", {"prompt": "hi", "best_of": 2}),
    ("n over its bound", {"prompt": "hi", "n": 65}),
    ("unknown chat role", {"messages": [{"role": "robot", "content": "hi"}]}),
    ("empty messages", {"messages": []}),
    ("stream_step zero", {"prompt": "hi", "stream_step": 0}),
    ("logprobs too many", {"prompt": "hi", "logprobs": 50}),
    ("min_tokens above max_tokens", {"prompt": "hi", "max_tokens": 4, "min_tokens": 5}),
    ("logit_bias above 100", {"prompt": "hi", "logit_bias": {"5": 150}}),
    ("logit_bias key not a token id", {"prompt": "hi", "logit_bias": {"hi": 1}}),
    ("repetition_penalty zero", {"prompt": "hi", "repetition_penalty": 0}),
    ("presence_penalty out of range", {"prompt": "hi", "presence_penalty": 2.5}),
    ("stop_token_ids negative", {"prompt": "hi", "stop_token_ids": [-1]}),
    ("deadline not an instant", {"prompt": "hi", "deadline": "tomorrow"}),
    ("deadline without a time zone", {"prompt": "hi", "deadline": "2030-01-01T00:00:00"}),
    ("deadline a boolean", {"prompt": "hi", "deadline": True}),
    ("body is a list", ["prompt", "hi"]),
]


@pytest.mark.parametrize(("case", "body"), INVALID_BODIES, ids=[case for case, _ in INVALID_BODIES])
async def test_invalid_submission_is_422_and_creates_nothing(
    gateway: httpx.AsyncClient, redis_client: aioredis.Redis, settings: Settings, case: str, body: Any
) -> None:
    answer = await gateway.post("/v1/jobs", json=body)
    assert answer.status_code == 422, answer.text
    error = answer.json()
    assert error["error_type"] == "validation"
    assert error["error"]
    assert isinstance(error["detail"], list) and error["detail"]
    assert await _keys(redis_client, settings) == set()


@pytest.mark.parametrize("raw", [b"{not json", b"", b'{"prompt": "hi",}', b"\xff\xfe"])
async def test_malformed_json_is_422_and_creates_nothing(
    gateway: httpx.AsyncClient, redis_client: aioredis.Redis, settings: Settings, raw: bytes
) -> None:
    answer = await gateway.post("/v1/jobs", content=raw, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error_type"] == "validation"
    assert await _keys(redis_client, settings) == set()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/jobs/{id}"),
        ("GET", "/v1/jobs/{id}/events"),
        ("POST", "/v1/jobs/{id}/cancel"),
    ],
)
async def test_unknown_job_is_404_and_creates_nothing(
    gateway: httpx.AsyncClient, redis_client: aioredis.Redis, settings: Settings, method: str, path: str
) -> None:
    answer = await gateway.request(method, path.format(id=uuid.uuid4().hex))
    assert answer.status_code == 404, answer.text
    assert answer.json()["error_type"] == "not_found"
    assert await _keys(redis_client, settings) == set()


async def test_unknown_job_sse_is_404_before_the_stream_starts(gateway: httpx.AsyncClient) -> None:
    answer = await gateway.get(f"/v1/jobs/{uuid.uuid4().hex}/events", headers={"Accept": "text/event-stream"})
    assert answer.status_code == 404
    assert answer.json()["error_type"] == "not_found"


async def test_garbage_cursor_is_422(gateway: httpx.AsyncClient) -> None:
    job = (await gateway.post("/v1/jobs", json={"prompt": "hi"})).json()
    answer = await gateway.get(f"/v1/jobs/{job['id']}/events", params={"after": "yesterday"})
    assert answer.status_code == 422
    assert answer.json()["error_type"] == "validation"


@pytest.mark.parametrize(
    "params",
    [
        {"limit": "0"},
        {"limit": "1001"},
        {"limit": "some"},
        {"wait": "-1"},
        {"wait": "3601"},
        {"wait": "soon"},
        {"after": "1" * 42},
    ],
)
async def test_a_poll_with_a_value_out_of_its_bounds_is_422(
    gateway: httpx.AsyncClient, params: dict[str, str]
) -> None:
    job = (await gateway.post("/v1/jobs", json={"prompt": "hi"})).json()
    answer = await gateway.get(f"/v1/jobs/{job['id']}/events", params=params)
    assert answer.status_code == 422
    assert answer.json()["error_type"] == "validation"
    assert answer.json()["detail"][0]["loc"][1] == next(iter(params))


async def test_a_page_is_the_same_whichever_way_its_values_are_written(gateway: httpx.AsyncClient) -> None:
    """Plain values are read before the application's stack (`gateway.plain_polls`), others by FastAPI."""
    job_id = (await gateway.post("/v1/jobs", json={"prompt": "hi"})).json()["id"]
    await gateway.post(f"/v1/jobs/{job_id}/cancel")
    events = f"/v1/jobs/{job_id}/events"
    for plain, other in [
        ({"limit": "1", "wait": "0"}, {"limit": "01", "wait": "0.0e0"}),
        ({}, {"wait": " 0 "}),
    ]:
        answers = [await gateway.get(events, params=params) for params in (plain, other)]
        assert [answer.status_code for answer in answers] == [200, 200]
        assert answers[0].content == answers[1].content
        assert answers[0].headers["content-type"] == answers[1].headers["content-type"] == "application/json"
    first = (await gateway.get(events, params={"limit": "1"})).json()
    assert (first["cursor"], first["done"]) == (first["events"][0]["id"], False)
    assert (await gateway.get(events, params={"after": first["cursor"]})).json()["done"] is True


async def test_submission_past_the_queue_limit_is_429_with_retry_after(
    gateway: httpx.AsyncClient, redis_client: aioredis.Redis, settings: Settings
) -> None:
    for _ in range(settings.max_queued_jobs):
        assert (await gateway.post("/v1/jobs", json={"prompt": "hi"})).status_code == 202
    keys_before = await _keys(redis_client, settings)
    answer = await gateway.post("/v1/jobs", json={"prompt": "hi"})
    assert answer.status_code == 429
    assert answer.json()["error_type"] == "overloaded"
    assert int(answer.headers["Retry-After"]) >= 1
    assert await _keys(redis_client, settings) == keys_before


async def test_submission_answers_202_with_location_and_urls(gateway: httpx.AsyncClient) -> None:
    answer = await gateway.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 4})
    assert answer.status_code == 202
    job = answer.json()
    assert job["status"] == "queued"
    assert answer.headers["Location"] == f"/v1/jobs/{job['id']}" == job["urls"]["self"]
    assert job["urls"]["events"] == f"/v1/jobs/{job['id']}/events"
    assert job["urls"]["cancel"] == f"/v1/jobs/{job['id']}/cancel"


async def test_same_idempotency_key_returns_the_same_job(gateway: httpx.AsyncClient) -> None:
    headers = {"Idempotency-Key": f"key-{uuid.uuid4()}"}
    first = await gateway.post("/v1/jobs", json={"prompt": "hi"}, headers=headers)
    second = await gateway.post("/v1/jobs", json={"prompt": "hi"}, headers=headers)
    other = await gateway.post("/v1/jobs", json={"prompt": "hi"}, headers={"Idempotency-Key": "another"})
    assert first.json()["id"] == second.json()["id"] != other.json()["id"]
    assert second.headers["Idempotent-Replayed"] == "true"
    assert first.json()["created_at"] == second.json()["created_at"]


async def test_cancel_of_a_queued_job_ends_it_without_a_worker(
    gateway: httpx.AsyncClient, redis_client: aioredis.Redis, settings: Settings
) -> None:
    job_id = (await gateway.post("/v1/jobs", json={"prompt": "hi"})).json()["id"]
    queue = Keys.of(settings).model(settings.model_name).queue
    assert await redis_client.zscore(queue, job_id) is not None
    answer = await gateway.post(f"/v1/jobs/{job_id}/cancel")
    assert answer.status_code == 202
    assert answer.json()["status"] == "cancelled"
    record = (await gateway.get(f"/v1/jobs/{job_id}")).json()
    assert record["status"] == "cancelled"
    assert record["started_at"] is None and record["worker"] is None
    page = (await gateway.get(f"/v1/jobs/{job_id}/events")).json()
    assert [event["type"] for event in page["events"]] == ["status", "cancelled"]
    assert page["done"] is True
    assert await redis_client.zscore(queue, job_id) is None  # no worker can pick it up any more
    again = await gateway.post(f"/v1/jobs/{job_id}/cancel")
    assert again.status_code == 200
    assert again.json()["status"] == "cancelled"


async def test_cancel_of_a_finished_job_changes_nothing(
    gateway: httpx.AsyncClient, redis_client: aioredis.Redis, settings: Settings
) -> None:
    store = JobStore(redis_client, Keys.of(settings), settings)
    worker = StandInWorker(store, await submit(gateway, prompt="Hi", max_tokens=DELTAS))
    await worker.start()
    await worker.run_to_done()
    events = await read_sse(gateway, worker.job_id)
    answer = await gateway.post(f"/v1/jobs/{worker.job_id}/cancel")
    assert answer.status_code == 200
    assert answer.json()["status"] == "completed"
    assert "nothing changed" in answer.json()["message"]
    assert await read_sse(gateway, worker.job_id) == events


async def test_health_without_workers_is_200_while_a_model_is_declared(gateway: httpx.AsyncClient) -> None:
    answer = await gateway.get("/health")  # the default model is declared: its jobs wait for a worker
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok", "redis": "ok", "workers": 0, "models": 1}


async def test_health_without_workers_or_models_is_503_with_the_reason(redis_url: str) -> None:
    settings = make_settings(redis_url, allow_unauthenticated=True, default_model=None)
    async with in_process_gateway(settings) as http:
        answer = await http.get("/health")
    assert answer.status_code == 503
    assert answer.json()["error_type"] == "unavailable"
    assert answer.json()["error"] == "no worker has a live heartbeat and no model is declared"


async def test_gateway_answers_503_when_redis_is_unreachable() -> None:
    nothing_listens = free_port()
    settings = Settings(
        redis_url=f"redis://127.0.0.1:{nothing_listens}/0",
        key_prefix="sptest-down",
        allow_unauthenticated=True,
    )
    async with in_process_gateway(settings) as http:
        submit = await http.post("/v1/jobs", json={"prompt": "hi"})
        health = await http.get("/health")
    assert submit.status_code == 503 and submit.json()["error_type"] == "unavailable"
    assert health.status_code == 503 and "Redis" in health.json()["error"]


# Raw bodies no JSON encoder would write: lone surrogates, numbers past any range, deep nesting.
ODD_BODIES: list[tuple[str, str, bytes]] = [
    ("lone surrogate in prompt", "/v1/jobs", b'{"prompt": "a\\ud800b"}'),
    ("lone low surrogate", "/v1/jobs", b'{"prompt": "\\udfff"}'),
    ("surrogate in a message", "/v1/jobs", b'{"messages": [{"role": "user", "content": "\\ud83d"}]}'),
    ("max_tokens infinite", "/v1/jobs", b'{"prompt": "hi", "max_tokens": 1e400}'),
    ("max_tokens of 5000 digits", "/v1/jobs", b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}"),
    ("temperature NaN", "/v1/jobs", b'{"prompt": "hi", "temperature": NaN}'),
    ("seed past 64 bits", "/v1/jobs", b'{"prompt": "hi", "seed": 1180591620717411303424}'),
    ("nested ten thousand deep", "/v1/jobs", b'{"prompt": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"),
    ("messages as an object", "/v1/jobs", b'{"messages": {"role": "user", "content": "hi"}}'),
    ("17 stop strings", "/v1/jobs", b'{"prompt": "hi", "stop": [' + b",".join([b'"x"'] * 17) + b"]}"),
    ("OpenAI prompt with a surrogate", "/v1/completions", b'{"model": "m", "prompt": "\\ud800"}'),
    ("OpenAI max_tokens huge", "/v1/completions", b'{"model": "m", "prompt": "hi", "max_tokens": 1e30}'),
    (
        "OpenAI temperature infinite",
        "/v1/chat/completions",
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}',
    ),
    ("TGI inputs with a surrogate", "/generate", b'{"inputs": "\\ud800"}'),
    ("TGI seed past 64 bits", "/generate_stream", b'{"inputs": "hi", "parameters": {"seed": 1e300}}'),
    (
        "TGI a hundred stop strings",
        "/",
        b'{"inputs": "hi", "parameters": {"stop": [' + b",".join([b'"x"'] * 100) + b"]}}",
    ),
]


@pytest.mark.parametrize(("case", "path", "raw"), ODD_BODIES, ids=[case for case, _, _ in ODD_BODIES])
async def test_odd_input_is_a_clear_4xx_and_creates_nothing(
    gateway: httpx.AsyncClient,
    redis_client: aioredis.Redis,
    settings: Settings,
    case: str,
    path: str,
    raw: bytes,
) -> None:
    answer = await gateway.post(path, content=raw, headers={"Content-Type": "application/json"})
    assert 400 <= answer.status_code < 500, answer.text
    assert answer.json()["error"]
    assert await _keys(redis_client, settings) == set()


def _body(size: int) -> list[bytes]:
    return [b'{"prompt": "', *[b"x" * 1024] * (size // 1024), b'"}']


async def _chunked(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/completions", "/generate"])
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
async def test_a_body_over_max_body_bytes_is_413_and_creates_nothing(
    gateway: httpx.AsyncClient, redis_client: aioredis.Redis, settings: Settings, path: str, declared: bool
) -> None:
    body = _body(MAX_BODY_BYTES + 1024)
    content = b"".join(body) if declared else _chunked(body)
    answer = await gateway.post(path, content=content, headers={"Content-Type": "application/json"})
    assert answer.status_code == 413, answer.text
    if path == "/v1/completions":
        assert answer.json()["error"]["code"] == "body_too_large"
    else:
        assert answer.json()["error_type"] == "body_too_large"
        assert answer.json()["max_body_bytes"] == MAX_BODY_BYTES
    assert await _keys(redis_client, settings) == set()


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
async def test_a_body_over_max_body_bytes_is_413_also_on_a_route_that_reads_none(
    gateway: httpx.AsyncClient, declared: bool
) -> None:
    """A request without a body passes the cap unread; one that has a body is capped whatever its method."""
    body = _body(MAX_BODY_BYTES + 1024)
    content = b"".join(body) if declared else _chunked(body)
    answer = await gateway.request("GET", "/v1/jobs/no-such-job/events", content=content)
    assert answer.status_code == 413, answer.text
    assert (await gateway.get("/v1/jobs/no-such-job/events")).status_code == 404


async def test_a_body_just_under_max_body_bytes_is_read(gateway: httpx.AsyncClient) -> None:
    prompt = "x" * (MAX_BODY_BYTES - 100)
    answer = await gateway.post("/v1/jobs", json={"prompt": prompt, "max_tokens": 1})
    assert answer.status_code == 202, answer.text
