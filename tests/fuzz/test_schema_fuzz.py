"""Every route of the OpenAPI document, fuzzed with schemathesis: no 500s, no answer off its schema.

The gateway is a real process that requires an API key, with the real default model's card
published (so prompts are counted) and no worker: jobs it takes stay queued, which keeps this
cheap, and its routes that need a live worker answer 503 after checking the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.config import SchemathesisConfig
from schemathesis.schemas import BaseSchema

from gateway.app import create_app
from shared.config import DEFAULT_MODEL_DIR, Settings
from shared.keys import Keys
from shared.model_card import publish_model_card
from tests.gateway.keyed_gateway import KEY_A, KeyedGateway, run_keyed_gateway
from worker.model_card import build_model_card

EXAMPLES_PER_ROUTE = 100  # the whole run takes a couple of minutes on a 2-core machine


async def _publish_card(gateway: KeyedGateway) -> None:
    card = build_model_card(DEFAULT_MODEL_DIR, gateway.settings.model_name, gateway.settings.max_model_len)
    assert card is not None
    client = aioredis.Redis.from_url(gateway.settings.redis_url, decode_responses=True)
    try:
        await publish_model_card(client, Keys(gateway.settings.key_prefix), card)
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def gateway(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedGateway]:
    # A short long-poll wait: fuzzed `wait` values must not hold a case for half a minute.
    yield from run_keyed_gateway(redis_url, tmp_path_factory.mktemp("fuzz"), poll_wait_max=0.2)


@pytest.fixture(scope="module")
def api_schema(gateway: KeyedGateway) -> BaseSchema:
    if DEFAULT_MODEL_DIR.is_dir():
        asyncio.run(_publish_card(gateway))
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


def _routes() -> list[tuple[str, str]]:
    """(method, path) of every operation the gateway documents, read from the app itself."""
    document = create_app(Settings(allow_unauthenticated=True)).openapi()
    return [(method.upper(), path) for path, item in document["paths"].items() for method in item]


# schemathesis' own pytest integration does not run on this pytest; its strategies do, with Hypothesis.
@pytest.mark.parametrize(("method", "path"), _routes(), ids=[f"{m} {p}" for m, p in _routes()])
def test_every_route_answers_within_its_documented_schema(
    api_schema: BaseSchema, method: str, path: str
) -> None:
    operation = api_schema[path][method]
    cases = st.one_of(
        operation.as_strategy(mode) for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    )

    @settings(
        max_examples=EXAMPLES_PER_ROUTE, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(case=cases)
    def answers_as_documented(case: Case) -> None:
        case.call_and_validate()

    answers_as_documented()
