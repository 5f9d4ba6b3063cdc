"""`gateway`: an in-process gateway client on the `settings` fixture that each test module defines;
`gateway_process`: a real gateway process without keys or workers, one per test process;
`relay`: the gateway's stream reading on the real Redis, without a gateway, under a prefix of its own;
`card`: the default model's card, as a worker builds it; `published`: that card published under the
prefix of the test's `settings`, as a worker publishes it; `owner` and `stranger`: `openai` clients of
the `keyed` gateway under two API keys."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from gateway.relay.hub import StreamHub
from gateway.relay.relay import Relay
from gateway.relay.server_notices import ServerNotices
from shared.config import DEFAULT_MODEL_DIR, Settings
from shared.keys import Keys
from shared.model_card import ModelCard, publish_model_card
from shared.redis_client import connect_reader
from tests.gateway.keyed_gateway import KEY_A, KEY_B, KeyedGateway, run_gateway
from tests.helpers import in_process_gateway
from tests.redis_cleanup import delete_prefix


@pytest.fixture
async def gateway(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with in_process_gateway(settings) as http:
        yield http


PING_SECONDS = 60.0
"""`gateway_process`'s keep-alive interval: far past every deadline of its tests, so that no answer
they wait for can be a keep-alive."""
POLL_WAIT = 30
"""`gateway_process`'s longest long-poll: one that waits this long would hold a reader far past a
test's deadline."""


@pytest.fixture(scope="session")
def gateway_process(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedGateway]:
    """A real gateway process without keys or workers: jobs submitted over HTTP stay queued until a test
    writes their events. Shared by the modules that need no other settings (tests/schedule.py runs them
    in one process); every test makes jobs of its own, under new ids."""
    yield from run_gateway(
        redis_url,
        tmp_path_factory.mktemp("gateway-process"),
        allow_unauthenticated=True,
        sse_ping_seconds=PING_SECONDS,
        poll_wait_max=POLL_WAIT,
    )


@pytest.fixture
async def relay(redis_url: str, redis_client: aioredis.Redis) -> AsyncIterator[Relay]:
    keys = Keys.of(Settings(key_prefix=f"sptest-relay-{uuid.uuid4().hex[:8]}"))  # notice partitions too
    hub = StreamHub(ServerNotices(connect_reader(redis_url, keys.stream_reader_name), keys))
    yield Relay(redis_client, keys, hub)
    await hub.close()
    delete_prefix(redis_url, keys.prefix)


@pytest.fixture(scope="session")
def card(model_card: ModelCard | None) -> ModelCard:
    if model_card is None:
        pytest.skip(f"the default model is not prepared in {DEFAULT_MODEL_DIR} (streampool prepare-model)")
    return model_card


@pytest.fixture
async def published(card: ModelCard, settings: Settings, redis_client: aioredis.Redis) -> ModelCard:
    await publish_model_card(redis_client, Keys.of(settings), card)
    return card


def _keyed_client(keyed: KeyedGateway, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{keyed.base_url}/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture
async def owner(keyed: KeyedGateway) -> AsyncIterator[openai.AsyncOpenAI]:
    """The `keyed` gateway's client under KEY_A, whose objects the tests make."""
    async with _keyed_client(keyed, KEY_A) as client:
        yield client


@pytest.fixture
async def stranger(keyed: KeyedGateway) -> AsyncIterator[openai.AsyncOpenAI]:
    """The `keyed` gateway's client under KEY_B, another key than `owner`'s."""
    async with _keyed_client(keyed, KEY_B) as client:
        yield client
