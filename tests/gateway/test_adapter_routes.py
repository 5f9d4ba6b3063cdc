"""vLLM's runtime adapter routes on a gateway with no worker: mounted only where allowed, for admin keys
only, refusing what vLLM refuses before anything is kept, and keeping a load no worker could take yet
for the workers to come (its jobs queue). What workers do with a load is
tests/faults/test_runtime_adapters.py's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from pydantic import BaseModel

from gateway.compat.vllm import LoadLoRAAdapterBody, UnloadLoRAAdapterBody
from shared.adapters import runtime_adapters
from shared.config import DEFAULT_MODEL_DIR, Settings
from shared.keys import Keys
from tests.conftest import make_settings
from tests.gateway.keyed_gateway import bearer
from tests.helpers import in_process_gateway
from tests.redis_cleanup import delete_prefix
from tests.vllm_protocol import vllm_protocol

ADMIN = "sk-admin-adapters"
USER = "sk-user-adapters"
MODEL = DEFAULT_MODEL_DIR.name


@pytest.fixture
async def settings(redis_url: str, tmp_path: Path) -> AsyncIterator[Settings]:
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(f'[[keys]]\nkey = "{ADMIN}"\nadmin = true\n\n[[keys]]\nkey = "{USER}"\n')
    settings = make_settings(
        redis_url, api_keys_file=keys_file, allow_runtime_lora_updating=True, adapter_load_wait_seconds=0.3
    )
    yield settings
    delete_prefix(redis_url, settings.key_prefix)


async def test_only_an_admin_key_may_load_or_unload_an_adapter(settings: Settings) -> None:
    body = {"lora_name": "sea", "lora_path": "/adapters/sea"}
    async with in_process_gateway(settings) as gateway:
        for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            assert (await gateway.post(path, json=body)).status_code == 401
            refused = await gateway.post(path, json=body, headers=bearer(USER))
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["message"].startswith("this route needs an admin key")
        missing = await gateway.post(
            "/v1/load_lora_adapter", json={"lora_name": "sea"}, headers=bearer(ADMIN)
        )
        assert missing.status_code == 400, missing.text


async def test_a_load_no_worker_takes_in_time_is_a_503_and_stays_for_the_workers_to_come(
    settings: Settings, redis_client: aioredis.Redis
) -> None:
    keys = Keys.of(settings)
    admin = bearer(ADMIN)
    async with in_process_gateway(settings) as gateway:
        body = {"lora_name": "sea", "lora_path": "/adapters/sea"}
        answer = await gateway.post("/v1/load_lora_adapter", json=body, headers=admin)
        assert answer.status_code == 503, answer.text
        assert "no worker of" in answer.json()["error"]["message"]
        kept = await runtime_adapters(redis_client, keys)
        assert (kept["sea"].model, kept["sea"].path) == (MODEL, "/adapters/sea")

        listed = {
            entry["id"]: entry for entry in (await gateway.get("/v1/models", headers=admin)).json()["data"]
        }
        assert (listed["sea"]["root"], listed["sea"]["parent"]) == ("/adapters/sea", MODEL)
        queued = await gateway.post("/v1/jobs", json={"prompt": "hi", "model": "sea"}, headers=bearer(USER))
        assert queued.status_code == 202, queued.text

        unloaded = await gateway.post("/v1/unload_lora_adapter", json={"lora_name": "sea"}, headers=admin)
        assert (unloaded.status_code, unloaded.text) == (
            200,
            "Success: LoRA adapter 'sea' removed successfully.",
        )
        assert await runtime_adapters(redis_client, keys) == {}
        refused = await gateway.post("/v1/jobs", json={"prompt": "hi", "model": "sea"}, headers=bearer(USER))
        assert refused.status_code == 404, refused.text


async def test_the_routes_are_not_there_unless_allowed(redis_url: str) -> None:
    settings = make_settings(redis_url, allow_unauthenticated=True)
    try:
        async with in_process_gateway(settings) as gateway:
            for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
                answer = await gateway.post(path, json={"lora_name": "sea", "lora_path": "/adapters/sea"})
                assert answer.status_code == 404, answer.text
    finally:
        delete_prefix(redis_url, settings.key_prefix)


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (LoadLoRAAdapterBody, "LoadLoRAAdapterRequest"),
        (UnloadLoRAAdapterBody, "UnloadLoRAAdapterRequest"),
    ],
)
def test_the_bodies_take_every_field_of_vllms_with_its_defaults(ours: type[BaseModel], theirs: str) -> None:
    vllms: type[BaseModel] = getattr(vllm_protocol(), theirs)
    for name, field in vllms.model_fields.items():
        assert name in ours.model_fields, name
        assert ours.model_fields[name].default == field.default, name
