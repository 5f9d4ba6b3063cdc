"""Models: a worker's names from its settings, the keys of one model, the registry its heartbeats
write (on the real Redis), and how a request's model name resolves to a queue and an adapter."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError

from shared.config import WorkerSettings
from shared.errors import BackendUnavailable, ModelNotFound, ModelRequired
from shared.keys import Keys
from shared.models import Catalog, ModelEntry, Target, read_registry
from shared.workers import WorkerInfo, announce
from tests.conftest import delete_test_keys

BASE = ModelEntry(name="smol", aliases=["smol-chat"], adapters=["pirate", "poet"], max_model_len=2048)
OTHER = ModelEntry(name="other", aliases=["gpt-4o"], adapters=["poet"])


def test_served_model_name_gives_the_canonical_name_first_and_aliases_after() -> None:
    settings = WorkerSettings(model=Path("/models/SmolLM2"), served_model_name=" smol, smol-chat ,smol")
    assert (settings.model_name, settings.model_names) == ("smol", ["smol", "smol-chat"])
    assert WorkerSettings(model=Path("/models/SmolLM2")).model_names == ["SmolLM2"]


def test_lora_settings_name_their_adapters_by_name_and_refuse_what_cannot_be_routed() -> None:
    settings = WorkerSettings(lora=["pirate=/adapters/pirate", "poet = /adapters/poet"])
    assert settings.adapters == {"pirate": Path("/adapters/pirate"), "poet": Path("/adapters/poet")}
    for refused in (["no-path"], ["a:b=/x"], ["a=/x", "a=/y"]):
        with pytest.raises(ValidationError):
            WorkerSettings(lora=refused)


def test_every_key_of_a_model_is_under_its_own_root() -> None:
    model = Keys("sp").model("smol")
    assert (model.queue, model.wakeup, model.card) == (
        "sp:model:smol:queue",
        "sp:model:smol:queue:wakeup",
        "sp:model:smol:card",
    )
    assert Keys("sp").model("other").queue != model.queue


def test_names_resolve_to_a_model_and_an_adapter() -> None:
    catalog = Catalog([BASE, OTHER])
    assert catalog.resolve("smol") == Target("smol")
    assert catalog.resolve("smol-chat") == Target("smol")  # an alias: the canonical model's queue
    assert catalog.resolve("gpt-4o") == Target("other")
    assert catalog.resolve("pirate") == Target("smol", "pirate")  # an adapter by its own name
    assert catalog.resolve("smol:poet") == Target("smol", "poet")
    assert catalog.resolve("smol-chat:poet") == Target("smol", "poet")  # base by alias
    assert catalog.resolve("other:poet") == Target("other", "poet")
    assert Target("smol", "poet").qualified == "smol:poet"
    for unknown in ("nope", "smol:nope", "pirate:poet", "other:pirate"):
        with pytest.raises(ModelNotFound) as caught:
            catalog.resolve(unknown)
        assert caught.value.detail == {"param": "model"}


def test_a_model_name_wins_over_an_alias_and_an_alias_over_an_adapter_name() -> None:
    catalog = Catalog(
        [ModelEntry(name="a", aliases=["b"], adapters=["c"]), ModelEntry(name="c", aliases=["a"])]
    )
    assert catalog.resolve("a") == Target("a")
    assert catalog.resolve("c") == Target("c")


def test_a_request_naming_no_model_gets_the_default_or_the_only_one() -> None:
    assert Catalog([BASE]).resolve(None) == Target("smol")
    assert Catalog([BASE, OTHER]).resolve(None, default="smol-chat") == Target("smol")
    with pytest.raises(ModelRequired) as caught:
        Catalog([BASE, OTHER]).resolve(None)
    assert caught.value.detail == {"param": "model"} and "smol" in caught.value.message


def test_nothing_known_is_unavailable_and_declared_models_are_known() -> None:
    with pytest.raises(BackendUnavailable):
        Catalog([]).resolve("smol")
    declared = Catalog([], declared=["big"])
    assert declared.resolve("big") == Target("big") and declared.workers["big"] == 0


def test_live_workers_of_one_model_add_up_their_adapters_and_count() -> None:
    now = time.time()
    live = [
        ModelEntry(name="smol", adapters=["pirate"], last_seen=now),
        ModelEntry(name="smol", adapters=["poet"], last_seen=now),
    ]
    catalog = Catalog([ModelEntry(name="smol", last_seen=now - 60)], live=live)
    assert catalog.entries["smol"].adapters == ["pirate", "poet"]
    assert catalog.workers["smol"] == 2 and catalog.resolve("poet") == Target("smol", "poet")


def test_a_worker_takes_its_adapter_from_the_name_its_job_carries() -> None:
    assert Target.of_job("smol:pirate", "smol") == Target("smol", "pirate")
    assert Target.of_job("smol", "smol") == Target("smol")
    assert Target.of_job(None, "smol") == Target("smol")
    assert Target.of_job("smol:a:b", "smol") == Target("smol", "a:b")


async def test_heartbeats_remember_their_model_after_the_worker_is_gone(redis_client: aioredis.Redis) -> None:
    keys = Keys(f"sptest-models-{time.time_ns()}")
    now = time.time()
    info = WorkerInfo(
        worker_id="w1",
        model="smol",
        aliases=["smol-chat"],
        adapters=["pirate"],
        max_model_len=2048,
        running_jobs=0,
        engine_requests=0,
        started_at=now,
        heartbeat_at=now,
        host="test",
        pid=0,
    )
    try:
        await announce(redis_client, keys, info, ttl_ms=100)
        await redis_client.delete(keys.worker("w1"))  # as its heartbeat's TTL ends
        (entry,) = await read_registry(redis_client, keys)
    finally:
        await delete_test_keys(redis_client, keys)
    assert entry == ModelEntry(
        name="smol", aliases=["smol-chat"], adapters=["pirate"], max_model_len=2048, last_seen=now
    )
