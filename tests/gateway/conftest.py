"""`gateway`: an in-process gateway client on the `settings` fixture that each test module defines;
`relay`: the gateway's stream reading on the real Redis, without a gateway, under a prefix of its own;
`card`: the default model's card, as a worker builds it; `published`: that card published under the
prefix of the test's `settings`, as a worker publishes it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from gateway.fanout import StreamHub
from gateway.relay import Relay
from shared.config import DEFAULT_MODEL_DIR, Settings
from shared.keys import Keys
from shared.model_card import ModelCard, publish_model_card
from shared.redis_client import connect_reader
from tests.gateway.stand_ins import CARD_CONTEXT, CARD_MODEL
from tests.helpers import in_process_gateway
from tests.redis_cleanup import delete_prefix
from worker.model_card import build_model_card


@pytest.fixture
async def gateway(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with in_process_gateway(settings) as http:
        yield http


@pytest.fixture
async def relay(redis_url: str, redis_client: aioredis.Redis) -> AsyncIterator[Relay]:
    keys = Keys(f"sptest-relay-{uuid.uuid4().hex[:8]}")
    hub = StreamHub(connect_reader(redis_url, keys.stream_reader_name), redis_client)
    yield Relay(redis_client, keys, hub)
    await hub.close()
    delete_prefix(redis_url, keys.prefix)


@pytest.fixture(scope="module")
def card() -> ModelCard:
    if not DEFAULT_MODEL_DIR.is_dir():
        pytest.skip(f"the default model is not prepared in {DEFAULT_MODEL_DIR} (streampool prepare-model)")
    built = build_model_card(DEFAULT_MODEL_DIR, CARD_MODEL, CARD_CONTEXT)
    assert built is not None
    return built


@pytest.fixture
async def published(card: ModelCard, settings: Settings, redis_client: aioredis.Redis) -> ModelCard:
    await publish_model_card(redis_client, Keys(settings.key_prefix), card)
    return card
