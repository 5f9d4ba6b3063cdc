"""Stored chat completions are their API key's alone, through the real `openai` package against a real
gateway process with API keys (no worker: a stand-in runs each job through the job store's own
transitions): another key gets 404 on every route and lists none of them, a deleted one is gone, and
metadata past OpenAI's bounds is refused before any job is made."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable

import openai
import pytest
import redis.asyncio as aioredis
from openai.types.chat import ChatCompletion

from gateway.auth import owner_id
from shared.config import DEFAULT_MODEL_DIR
from shared.jobstore import JobStore
from tests.gateway.keyed_gateway import KEY_A, KeyedGateway
from tests.gateway.stand_ins import StandInWorker
from tests.helpers import eventually

MODEL = DEFAULT_MODEL_DIR.name  # the gateway's default model (tests.conftest.make_settings)


async def _stored_and_answered(
    owner: openai.AsyncOpenAI, keyed: KeyedGateway, redis_client: aioredis.Redis, metadata: dict[str, str]
) -> ChatCompletion:
    """A stored chat completion of KEY_A's, its job run to its end by a stand-in worker."""
    index = keyed.keys.stored_chat_completions(owner_id(KEY_A))
    before = set(await redis_client.zrange(index, 0, -1))
    asking = asyncio.create_task(
        owner.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], store=True, metadata=metadata
        )
    )

    async def indexed() -> set[str]:
        return set(await redis_client.zrange(index, 0, -1)) - before

    (job_id,) = await eventually(indexed, "the stored completion is indexed")
    store = JobStore(redis_client, keyed.keys, keyed.settings)
    worker = StandInWorker(store, job_id)
    await worker.start(await store.model_of(job_id))
    await worker.run_to_done(finish_reason="stop")
    return await asyncio.wait_for(asking, 10)


async def test_a_stored_completion_is_invisible_to_another_key_and_gone_after_delete(
    owner: openai.AsyncOpenAI,
    stranger: openai.AsyncOpenAI,
    keyed: KeyedGateway,
    redis_client: aioredis.Redis,
) -> None:
    run = {"run": uuid.uuid4().hex}
    created = await _stored_and_answered(owner, keyed, redis_client, run)
    assert (await owner.chat.completions.retrieve(created.id)).choices == created.choices
    calls: list[Awaitable[object]] = [
        stranger.chat.completions.retrieve(created.id),
        stranger.chat.completions.update(created.id, metadata={"taken": "yes"}),
        stranger.chat.completions.delete(created.id),
        stranger.chat.completions.messages.list(created.id),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError) as missing:
            await call
        assert missing.value.body == {
            "message": f"Chat completion with id '{created.id}' not found.",
            "type": "invalid_request_error",
            "param": None,
            "code": "not_found",
        }
    assert (await stranger.chat.completions.list(metadata=run)).data == []
    assert [c.id for c in (await owner.chat.completions.list(metadata=run)).data] == [created.id]
    assert (await owner.chat.completions.retrieve(created.id)).metadata == run  # the stranger changed none

    assert (await owner.chat.completions.delete(created.id)).deleted
    with pytest.raises(openai.NotFoundError):
        await owner.chat.completions.retrieve(created.id)
    assert (await owner.chat.completions.list(metadata=run)).data == []
    job_id = created.id.removeprefix("chatcmpl-")
    keys = keyed.keys
    assert not await redis_client.exists(keys.job(job_id), keys.stream(job_id))
    assert await redis_client.zscore(keys.stored_chat_completions(owner_id(KEY_A)), job_id) is None


@pytest.mark.parametrize(
    "metadata",
    [
        {f"k{n}": "v" for n in range(17)},
        {"k" * 65: "v"},
        {"k": "v" * 513},
        {"k": 1},
    ],
    ids=["17 pairs", "a key of 65 characters", "a value of 513 characters", "a value not a string"],
)
async def test_metadata_past_openais_bounds_is_400_and_makes_no_job(
    owner: openai.AsyncOpenAI, keyed: KeyedGateway, redis_client: aioredis.Redis, metadata: dict[str, object]
) -> None:
    records = keyed.keys.job("*")
    before = {key async for key in redis_client.scan_iter(records)}
    with pytest.raises(openai.BadRequestError) as refused:
        await owner.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            store=True,
            metadata=metadata,  # type: ignore[arg-type]
        )
    assert refused.value.param is not None and refused.value.param.startswith("metadata")
    assert {key async for key in redis_client.scan_iter(records)} == before


async def test_a_listing_filtered_past_openais_bounds_of_metadata_is_400(owner: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await owner.chat.completions.list(metadata={f"k{n}": "v" for n in range(17)})
    assert refused.value.param == "metadata"
