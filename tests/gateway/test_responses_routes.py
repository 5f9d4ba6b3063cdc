"""The Responses routes' answers that need no worker, through the real `openai` package against a real
gateway process with API keys: ownership (404 for another key), refusals naming the parameter, and
what a queued background response answers. No worker runs: background responses stay queued, unless
a test runs one with a stand-in worker."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from shared.config import DEFAULT_MODEL_DIR
from shared.jobstore import JobStore
from tests.gateway.keyed_gateway import KEY_A, KeyedGateway, bearer
from tests.gateway.stand_ins import StandInWorker
from tests.helpers import eventually
from tests.open_responses import suite_request, valid_error, valid_response

MODEL = DEFAULT_MODEL_DIR.name  # the gateway's default model (tests.conftest.make_settings)


async def test_another_keys_response_is_404_on_every_route(
    owner: openai.AsyncOpenAI, stranger: openai.AsyncOpenAI
) -> None:
    created = await owner.responses.create(model=MODEL, input="hi", background=True)
    assert (await owner.responses.retrieve(created.id)).status == "queued"
    calls = [
        stranger.responses.retrieve(created.id),
        stranger.responses.retrieve(created.id, stream=True),
        stranger.responses.cancel(created.id),
        stranger.responses.delete(created.id),
        stranger.responses.input_items.list(created.id),
        stranger.responses.create(
            model=MODEL, input="more", previous_response_id=created.id, background=True
        ),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError) as missing:
            await call
        assert missing.value.body == {
            "message": f"Response with id '{created.id}' not found.",
            "type": "invalid_request_error",
            "param": None,
            "code": "not_found",
        }
    assert (await owner.responses.cancel(created.id)).status == "cancelled"


async def test_ids_that_name_no_response_are_404(owner: openai.AsyncOpenAI) -> None:
    job = await owner.with_options().post("/jobs", body={"prompt": "hi"}, cast_to=dict)  # a native job
    for response_id in (f"resp_{job['id']}", "resp_nothex", job["id"], f"resp_{'0' * 32}"):
        with pytest.raises(openai.NotFoundError):
            await owner.responses.retrieve(response_id)


async def test_an_unfinished_response_is_neither_deleted_nor_continued_and_a_cancelled_one_is_deleted(
    owner: openai.AsyncOpenAI,
) -> None:
    created = await owner.responses.create(model=MODEL, input="hi", background=True)
    with pytest.raises(openai.BadRequestError, match="cancel it first"):
        await owner.responses.delete(created.id)
    with pytest.raises(openai.BadRequestError) as refused:
        await owner.responses.create(
            model=MODEL, input="more", previous_response_id=created.id, background=True
        )
    assert refused.value.param == "previous_response_id"
    cancelled = await owner.responses.cancel(created.id)
    assert (cancelled.status, cancelled.output) == ("cancelled", [])
    assert (await owner.responses.cancel(created.id)).status == "cancelled"  # idempotent
    await owner.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        await owner.responses.retrieve(created.id)


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"max_tool_calls": 2}, "max_tool_calls"),
        ({"background": True, "store": False}, "background"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input.0.content.0",
        ),
        ({"max_output_tokens": 10**6}, "max_output_tokens"),
    ],
)
async def test_unsupported_features_are_refused_with_400_naming_the_parameter_and_make_no_response(
    owner: openai.AsyncOpenAI, options: dict[str, object], param: str
) -> None:
    body: dict[str, object] = {"model": MODEL, "input": "hi", "background": True, **options}
    with pytest.raises(openai.BadRequestError) as refused:
        await owner.responses.create(**body)  # type: ignore[call-overload]
    assert refused.value.param == param


async def test_the_suites_image_request_gets_a_400_in_the_specs_error_shape_naming_the_parameter(
    keyed: KeyedGateway, redis_client: aioredis.Redis
) -> None:
    records = keyed.keys.job("*")
    before = {key async for key in redis_client.scan_iter(records)}
    async with httpx.AsyncClient(base_url=keyed.base_url, headers=bearer(KEY_A), timeout=30) as http:
        answer = await http.post("/v1/responses", json=suite_request("image-input", MODEL))
    assert answer.status_code == 400, answer.text
    error = valid_error(answer.json())
    assert (error.param, error.code, error.type) == (
        "input.0.content.1",
        "unsupported_parameter",
        "invalid_request_error",
    )
    assert {key async for key in redis_client.scan_iter(records)} == before


async def test_the_suites_tool_request_is_taken_and_its_response_reports_the_tool(
    keyed: KeyedGateway, redis_client: aioredis.Redis
) -> None:
    """No worker runs: the background response stays queued, its job holding the tool in the chat's
    shape."""
    body = suite_request("tool-calling", MODEL) | {"background": True}
    async with httpx.AsyncClient(base_url=keyed.base_url, headers=bearer(KEY_A), timeout=30) as http:
        answer = await http.post("/v1/responses", json=body)
        assert answer.status_code == 200, answer.text
        response = valid_response(answer.json())
        assert (response.status, response.tool_choice, response.tools[0].root.name) == (
            "queued",
            "auto",
            "get_weather",
        )
        job_id = response.id.removeprefix("resp_")
        request = json.loads(await redis_client.hget(keyed.keys.job(job_id), "request"))
        assert request["tools"][0]["function"]["name"] == "get_weather" and request["tool_choice"] == "auto"
        assert (await http.post(f"/v1/responses/{response.id}/cancel")).status_code == 200


async def test_compaction_and_the_websocket_mode_are_not_served(keyed: KeyedGateway) -> None:
    handshake = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    async with httpx.AsyncClient(base_url=keyed.base_url, headers=bearer(KEY_A), timeout=30) as http:
        compact = await http.post("/v1/responses/compact", json={"model": MODEL, "input": "hi"})
        websocket = await http.get("/v1/responses", headers=handshake)
    assert (compact.status_code, compact.json()["error"]["type"]) == (405, "invalid_request_error")
    assert websocket.status_code == 403


async def test_input_items_with_ids_the_client_repeated_page_to_the_end_each_item_once(
    owner: openai.AsyncOpenAI,
) -> None:
    texts = [str(n) for n in range(5)]
    created = await owner.responses.create(
        model=MODEL,
        input=[{"id": "msg_same", "type": "message", "role": "user", "content": text} for text in texts],
        background=True,
    )
    seen: list[str] = []
    after: str | None = None
    for _ in range(len(texts)):  # more pages than this: the pages go round
        page = await owner.responses.input_items.list(
            created.id, limit=2, order="asc", **({"after": after} if after else {})
        )
        seen += [item.content[0].text for item in page.data]  # type: ignore[union-attr]
        if not page.has_more:
            break
        after = page.last_id
    assert seen == texts
    await owner.responses.cancel(created.id)


@pytest.mark.parametrize("streamed", [True, False])
async def test_a_response_not_stored_is_readable_by_no_route_and_leaves_redis_once_answered(
    keyed: KeyedGateway, redis_client: aioredis.Redis, streamed: bool
) -> None:
    """A stand-in worker runs the job through the job store's transitions while its client waits."""
    store = JobStore(redis_client, keyed.keys, keyed.settings)
    marker = f"forget me {uuid.uuid4().hex}"
    body = {"model": MODEL, "input": marker, "store": False, "stream": streamed, "max_output_tokens": 5}
    async with httpx.AsyncClient(base_url=keyed.base_url, headers=bearer(KEY_A), timeout=30) as http:
        asking = asyncio.create_task(http.post("/v1/responses", json=body))
        job_id = await eventually(lambda: _job_asking(redis_client, keyed, marker), "the job is queued")
        worker = StandInWorker(store, job_id)
        await worker.start(await store.model_of(job_id))
        await worker.run_to_done()
        answer = await asyncio.wait_for(asking, 10)
        assert answer.status_code == 200, answer.text
        assert ("event: response.incomplete" in answer.text) if streamed else answer.json()["output"]
        for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/events", f"/v1/responses/resp_{job_id}"):
            assert (await http.get(path)).status_code == 404, path
    keys = keyed.keys
    assert not await redis_client.exists(keys.job(job_id), keys.stream(job_id), keys.cancel(job_id))


async def test_a_background_response_not_stored_is_refused_and_makes_no_job(
    owner: openai.AsyncOpenAI, keyed: KeyedGateway, redis_client: aioredis.Redis
) -> None:
    records = keyed.keys.job("*")
    before = {key async for key in redis_client.scan_iter(records)}
    with pytest.raises(openai.BadRequestError) as refused:
        await owner.responses.create(model=MODEL, input="hi", background=True, store=False)
    assert refused.value.param == "background"
    assert {key async for key in redis_client.scan_iter(records)} == before


async def _job_asking(redis_client: aioredis.Redis, keyed: KeyedGateway, text: str) -> str | None:
    """The id of the job whose request holds `text`, once there is one."""
    async for key in redis_client.scan_iter(keyed.keys.job("*"), _type="hash"):
        if text in (await redis_client.hget(key, "request") or ""):
            return str(key).rpartition(":")[2]
    return None


async def test_a_streamed_response_completes_at_the_time_its_job_ended(
    owner: openai.AsyncOpenAI, keyed: KeyedGateway, redis_client: aioredis.Redis
) -> None:
    """`completed_at` of the streamed `response.completed`, as the `openai` package parses it, is the
    time the job's last step was written, as the polled record's is: not its entry id, a seq."""
    store = JobStore(redis_client, keyed.keys, keyed.settings)
    stream = await owner.responses.create(model=MODEL, input="hi", stream=True, background=True)
    worker: asyncio.Task[None] | None = None
    completed: list[openai.types.responses.Response] = []
    async with stream:
        async for event in stream:
            if event.type == "response.created":
                job = StandInWorker(store, event.response.id.removeprefix("resp_"))
                await job.start(await store.model_of(job.job_id))
                worker = asyncio.create_task(job.run_to_done(finish_reason="stop"))
            if event.type == "response.completed":
                completed.append(event.response)
    assert worker is not None
    await worker
    polled = await owner.responses.retrieve(completed[0].id)
    assert polled.completed_at is not None and completed[0].completed_at is not None
    assert abs(completed[0].completed_at - polled.completed_at) <= 1  # whole seconds, two clocks
