"""Every route of the OpenAPI document, fuzzed with schemathesis: no 500s, no answer off its schema.

The gateway is a real process that requires an API key, with the real default model's card
published (so prompts are counted) and no worker: jobs it takes stay queued, which keeps this
cheap, and its routes that need a live worker answer 503 after checking the request.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import httpx
import pytest
import redis.asyncio as aioredis
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.config import SchemathesisConfig
from schemathesis.schemas import BaseSchema

from gateway.app import create_app
from gateway.auth import owner_id
from shared.config import Settings
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.model_card import ModelCard, publish_model_card
from shared.requests import JobRequest
from tests.gateway.keyed_gateway import KEY_A, KeyedGateway, bearer, run_keyed_gateway

# The whole run takes a couple of minutes on a 2-core machine: `make test` tries this many examples a
# route, `make test-fast` fewer (`--fuzz-examples`).
EXAMPLES_PER_ROUTE = 100
# A job's other keys are named `<job key>:<suffix>` (shared/keys.py): ids a generator rarely makes.
KEY_SUFFIXES = [":events", ":cancel", ":lease", ":webhook"]


async def _publish_card(gateway: KeyedGateway, card: ModelCard) -> None:
    """The default model's card, as a worker of the gateway's model would publish it."""
    settings = gateway.settings
    own = card.model_copy(update={"model": settings.model_name, "max_model_len": settings.max_model_len})
    client = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        await publish_model_card(client, gateway.keys, own)
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def gateway(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedGateway]:
    # A short long-poll wait: fuzzed `wait` values must not hold a case for half a minute. No model
    # declared: with none known, a request that waits for its output is a 503 at once (with one
    # declared and no worker, it would wait for that model's first worker, past the case's timeout).
    yield from run_keyed_gateway(
        redis_url, tmp_path_factory.mktemp("fuzz"), poll_wait_max=0.2, default_model=None
    )


@pytest.fixture(scope="module")
def api_schema(gateway: KeyedGateway, model_card: ModelCard | None) -> BaseSchema:
    if model_card is not None:
        asyncio.run(_publish_card(gateway, model_card))
    config = SchemathesisConfig.from_dict(
        {
            "auth": {"openapi": {"HTTPBearer": {"bearer": KEY_A}}},
            "request-timeout": 30,
            # Whether a valid body is taken depends on more than its schema (the context length,
            # the models live workers serve): refusals are checked to be documented, not absent.
            "checks": {
                "positive_data_acceptance": {"enabled": False},
                # 503 is how routes that need a worker answer here, documented; any other 5xx fails.
                "not_a_server_error": {"expected-statuses": ["2XX", "3XX", "4XX", 503]},
                # A body past max_body_bytes (a prompt past its maxLength, say) is refused with 413.
                "negative_data_rejection": {
                    "expected-statuses": [400, 401, 404, 405, 406, 413, 415, 422, 429, 503]
                },
            },
        }
    )
    return schemathesis.openapi.from_url(f"{gateway.base_url}/openapi.json", config=config)


async def _submitted_and_started(gateway: KeyedGateway) -> str:
    """KEY_A's job, submitted and started by stand-ins for the route and a worker (the gateway knows
    no model, so its routes queue none)."""
    client = aioredis.Redis.from_url(gateway.settings.redis_url, decode_responses=True)
    try:
        store = JobStore(client, Keys.of(gateway.settings), gateway.settings)
        request = JobRequest(prompt="every key", max_tokens=4)
        job_id = (await store.submit(request, owner=owner_id(KEY_A), model="model", max_queued=0)).job_id
        assert await store.start(job_id, "stand-in-worker", "model", lease_seconds=600) is not None
        return job_id
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def running_job(gateway: KeyedGateway) -> str:
    """KEY_A's job with every key of the layout present: stream, lease (started by a stand-in for a
    worker) and cancel key (a cancel asked while it runs)."""
    job_id = asyncio.run(_submitted_and_started(gateway))
    with httpx.Client(base_url=gateway.base_url, headers=bearer(KEY_A)) as http:
        assert http.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
    return job_id


def _routes() -> list[tuple[str, str]]:
    """(method, path) of every operation the gateway documents, read from the app itself."""
    document = create_app(Settings(allow_unauthenticated=True)).openapi()
    return [(method.upper(), path) for path, item in document["paths"].items() for method in item]


ROUTES = _routes()  # once: every test process builds the app to collect this module


# Header names HTTP itself refuses (not a token) or that frame the message: the HTTP server answers those
# 400 before any route sees them. Fuzzed headers are sent only when they could reach a route.
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
FRAMING_HEADERS = {"content-length", "transfer-encoding", "host", "connection", "expect", "upgrade", "te"}


def _sendable(name: str) -> bool:
    return bool(HEADER_NAME.fullmatch(name)) and name.lower() not in FRAMING_HEADERS


# schemathesis' own pytest integration does not run on this pytest; its strategies do, with Hypothesis.
@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_every_route_answers_within_its_documented_schema(
    api_schema: BaseSchema, pytestconfig: pytest.Config, method: str, path: str
) -> None:
    operation = api_schema[path][method]
    cases = st.one_of(
        operation.as_strategy(mode) for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    )

    @settings(
        max_examples=pytestconfig.getoption("fuzz_examples") or EXAMPLES_PER_ROUTE,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def answers_as_documented(case: Case) -> None:
        if case.headers:
            case.headers = {name: value for name, value in case.headers.items() if _sendable(name)}
        case.call_and_validate(session=session)

    # One connection kept open for the cases, as a client keeps one; schemathesis sends a case again on a
    # new one when the gateway has closed it (after a refused body, say).
    with requests.Session() as session:
        answers_as_documented()


# The console's job routes take an admin's key, which KEY_A is not (403 before any id): their ids are
# checked in tests/e2e/test_console.py.
JOB_ROUTES = [
    (method, path) for method, path in ROUTES if "{job_id}" in path and not path.startswith("/v1/console/")
]


@pytest.mark.parametrize(("method", "path"), JOB_ROUTES, ids=[f"{m} {p}" for m, p in JOB_ROUTES])
@pytest.mark.parametrize("suffix", KEY_SUFFIXES)
def test_a_job_id_naming_another_key_of_the_job_is_unknown(
    api_schema: BaseSchema, running_job: str, method: str, path: str, suffix: str
) -> None:
    job_id = f"{running_job}{suffix}"
    case = api_schema[path][method].Case(path_parameters={"job_id": job_id}, headers=bearer(KEY_A))
    assert case.call_and_validate().status_code == 404
