"""API keys and per-key isolation, against a real gateway process started with keys.

No worker runs: every check here is decided before a job would reach one (jobs stay queued).
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from gateway.auth import ApiKeys, AuthNotConfigured, owner_id
from shared.config import Settings
from shared.keys import Keys
from tests.gateway.keyed_gateway import KEY_A, KEY_B, KeyedGateway, bearer
from tests.processes import ROOT, free_port


@pytest.fixture
async def http(keyed: KeyedGateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=keyed.base_url, timeout=30) as client:
        yield client


async def submit(http: httpx.AsyncClient, key: str, **headers: str) -> str:
    answer = await http.post("/v1/jobs", json={"prompt": "hi"}, headers={**bearer(key), **headers})
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["id"]
    return job_id


PROTECTED: list[tuple[str, str, Any]] = [
    ("POST", "/v1/jobs", {"prompt": "hi"}),
    ("GET", "/v1/jobs/{id}", None),
    ("GET", "/v1/jobs/{id}/events", None),
    ("POST", "/v1/jobs/{id}/cancel", None),
    ("GET", "/v1/models", None),
    ("POST", "/generate", {"inputs": "hi"}),
    ("POST", "/generate_stream", {"inputs": "hi"}),
    ("POST", "/", {"inputs": "hi"}),
    ("GET", "/info", None),
]


@pytest.mark.parametrize("headers", [{}, bearer("wrong"), {"Authorization": f"Basic {KEY_A}"}])
@pytest.mark.parametrize(("method", "path", "body"), PROTECTED)
async def test_protected_routes_answer_401_without_a_valid_key(
    http: httpx.AsyncClient, method: str, path: str, body: Any, headers: dict[str, str]
) -> None:
    answer = await http.request(method, path.format(id=uuid.uuid4().hex), json=body, headers=headers)
    assert answer.status_code == 401, answer.text
    assert answer.headers["WWW-Authenticate"] == "Bearer"
    assert answer.json()["error_type"] == "unauthorized"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_openai_routes_answer_401_in_openai_shape(http: httpx.AsyncClient, path: str) -> None:
    answer = await http.post(path, json={"model": "m", "prompt": "hi"}, headers=bearer("wrong"))
    assert answer.status_code == 401
    assert answer.headers["WWW-Authenticate"] == "Bearer"
    assert answer.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("path", ["/health", "/metrics", "/", "/playground/playground.js", "/docs"])
async def test_health_metrics_and_the_playground_need_no_key(http: httpx.AsyncClient, path: str) -> None:
    answer = await http.get(path)
    assert answer.status_code != 401
    assert answer.status_code in (200, 503)  # /health: 503, no worker runs here


async def test_the_routes_that_answer_without_a_key_are_those_the_authentication_page_names(
    http: httpx.AsyncClient,
) -> None:
    """Every GET route of the API document (without a path parameter) asked without a key: those that
    answer are the API routes the page's first paragraph names as open, and only those."""
    paths = (await http.get("/openapi.json")).json()["paths"]
    gets = {path for path, operations in paths.items() if "get" in operations and "{" not in path}
    answering = {path for path in gets if (await http.get(path)).status_code != 401}
    first_paragraph = (ROOT / "docs" / "authentication.md").read_text().split("\n\n")[1]
    assert answering == set(re.findall(r"`(?:GET )?(/[^`]*)`", first_paragraph)) & gets
    assert "/version" in answering  # open, as on vLLM's server


async def test_another_keys_job_is_404_on_every_route(http: httpx.AsyncClient) -> None:
    job_id = await submit(http, KEY_A)
    base = f"/v1/jobs/{job_id}"
    sse = {"Accept": "text/event-stream"}
    foreign = [
        await http.get(base, headers=bearer(KEY_B)),
        await http.get(f"{base}/events", headers=bearer(KEY_B)),
        await http.get(f"{base}/events", headers={**bearer(KEY_B), **sse}),
        await http.post(f"{base}/cancel", headers=bearer(KEY_B)),
    ]
    unknown = await http.get(f"/v1/jobs/{uuid.uuid4().hex}", headers=bearer(KEY_B))
    for answer in foreign:
        assert answer.status_code == 404, answer.text
        # Word for word what an unknown job gets, but for the id: nothing tells that it exists.
        assert answer.json()["error"] == unknown.json()["error"].replace(
            unknown.url.path.split("/")[-1], job_id
        )
    own = await http.get(base, headers=bearer(KEY_A))
    assert own.status_code == 200 and own.json()["status"] == "queued"  # the foreign cancel did nothing
    page = await http.get(f"{base}/events", headers=bearer(KEY_A))
    assert page.status_code == 200 and page.json()["events"][0]["state"] == "queued"
    cancelled = await http.post(f"{base}/cancel", headers=bearer(KEY_A))
    assert cancelled.status_code == 202 and cancelled.json()["status"] == "cancelled"


async def test_idempotency_keys_are_each_keys_own(http: httpx.AsyncClient) -> None:
    same = {"Idempotency-Key": f"order-{uuid.uuid4().hex}"}
    first_a = await submit(http, KEY_A, **same)
    again_a = await submit(http, KEY_A, **same)
    first_b = await submit(http, KEY_B, **same)
    assert first_a == again_a != first_b
    assert (await http.get(f"/v1/jobs/{first_b}", headers=bearer(KEY_B))).status_code == 200


async def test_the_record_keeps_an_owner_id_and_never_the_key(
    http: httpx.AsyncClient, keyed: KeyedGateway, redis_client: aioredis.Redis
) -> None:
    job_id = await submit(http, KEY_A, **{"Idempotency-Key": "kept"})
    keys = Keys.of(keyed.settings)
    record = await redis_client.hgetall(keys.job(job_id))  # type: ignore[misc]
    assert record["owner"] == owner_id(KEY_A) != owner_id(KEY_B)
    names = [name async for name in redis_client.scan_iter(match=f"{keys.prefix}:*")]
    stored = " ".join([*names, *record.values()])
    assert KEY_A not in stored and KEY_B not in stored


async def test_the_openai_client_sends_its_api_key(keyed: KeyedGateway) -> None:
    base_url = f"{keyed.base_url}/v1"
    async with openai.AsyncOpenAI(base_url=base_url, api_key="wrong", max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError) as refused:
            await wrong.models.list()
        assert refused.value.status_code == 401
        with pytest.raises(openai.AuthenticationError) as refused:
            await wrong.completions.create(model="m", prompt="hi")
        assert refused.value.code == "invalid_api_key"
    async with openai.AsyncOpenAI(base_url=base_url, api_key=KEY_A, max_retries=0) as right:
        models = await right.models.list()
    # Past the key check: the declared model, with no worker alive.
    assert [(model.id, (model.model_extra or {})["workers"]) for model in models.data] == [
        (keyed.settings.default_model, 0)
    ]


def test_keys_are_kept_as_digests_and_matched_whichever_comes_first(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("second\n\nthird\n")
    api_keys = ApiKeys.from_settings(Settings(api_keys="first,,second", api_keys_file=keys_file))
    assert len(api_keys.digests) == 3 and all(len(digest) == 32 for digest in api_keys.digests)
    assert [api_keys.owner(key) for key in ("first", "second", "third")] == [
        owner_id("first"),
        owner_id("second"),
        owner_id("third"),
    ]


def test_without_keys_the_gateway_needs_allow_unauthenticated(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(AuthNotConfigured, match="STREAMPOOL_ALLOW_UNAUTHENTICATED"):
        ApiKeys.from_settings(Settings())
    with caplog.at_level("WARNING", logger="gateway.auth"):
        assert not ApiKeys.from_settings(Settings(allow_unauthenticated=True)).required
    assert "no API keys configured" in caplog.text


def test_the_gateway_command_refuses_to_start_without_keys() -> None:
    env = {"PATH": "/usr/bin:/bin", "STREAMPOOL_PORT": str(free_port()), "STREAMPOOL_LOG_LEVEL": "INFO"}
    started = subprocess.run(
        [sys.executable, "-m", "cli", "gateway"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert started.returncode != 0
    assert "no API keys configured" in started.stderr
