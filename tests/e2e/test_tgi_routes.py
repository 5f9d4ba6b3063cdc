"""What the gateway's text-generation-inference routes make of a job, whatever the engine: `huggingface_hub`'s
real clients and raw HTTP against a gateway and workers on the synthetic engine.

The synthetic engine answers a greedy request by its prompt and a sampled one by its seed, as the real
engine does, so a second run of a request gives the text of the first. What the real engine generates
through the same routes is in test_tgi_client.py.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from httpx_sse import aconnect_sse
from huggingface_hub import AsyncInferenceClient, InferenceClient

from tests.conftest import WORKERS, System
from tests.helpers import JOB_DEADLINE_SECONDS, tgi_stream, wait_for_status

PROMPT = "The capital of France is"
JOB_ID = "X-Streampool-Job-Id"
LONG_JOB = {"inputs": "Count to one thousand: 1, 2, 3, 4, 5, 6,", "parameters": {"max_new_tokens": 500}}


@pytest.fixture(scope="module")
def system(synthetic_system: System) -> System:
    """The subject is the routes' shapes and their end of a job, not generation: synthetic workers."""
    return synthetic_system


def test_return_full_text_prepends_the_prompt(hf: InferenceClient) -> None:
    text = hf.text_generation(PROMPT, max_new_tokens=4)
    assert hf.text_generation(PROMPT, max_new_tokens=4, return_full_text=True) == PROMPT + text


async def test_same_seed_samples_the_same_text_and_details_report_it(async_hf: AsyncInferenceClient) -> None:
    prompt = "A short poem about the sea:"
    sampled = [
        await async_hf.text_generation(
            prompt, max_new_tokens=24, do_sample=True, temperature=0.9, seed=seed, details=True
        )
        for seed in (1234, 1234, 99)
    ]
    assert sampled[0].generated_text == sampled[1].generated_text != ""
    assert sampled[2].generated_text != sampled[0].generated_text
    assert [output.details.seed for output in sampled if output.details] == [1234, 1234, 99]


async def test_generate_stream_names_its_job_and_adds_up_to_its_record(client: httpx.AsyncClient) -> None:
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 10, "details": True}}
    job_id, events = await tgi_stream(client, "/generate_stream", body)
    record = (await client.get(f"/v1/jobs/{job_id}")).json()
    assert record["status"] == "completed"
    assert events[-1]["generated_text"] == "".join(event["token"]["text"] for event in events)
    assert events[-1]["generated_text"] == record["output"]["text"]
    assert events[-1]["details"]["generated_tokens"] == len(events) == record["usage"]["completion_tokens"]
    assert events[-1]["details"]["input_length"] == record["usage"]["prompt_tokens"]
    assert [event["index"] for event in events] == list(range(1, len(events) + 1))


async def test_root_route_answers_as_generate_or_generate_stream_by_the_stream_flag(
    client: httpx.AsyncClient,
) -> None:
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 6}}
    answer = await client.post("/", json=body)
    assert answer.status_code == 200
    [listed] = answer.json()  # TGI's `POST /` lists its answer, as the Inference API did
    record = (await client.get(f"/v1/jobs/{answer.headers[JOB_ID]}")).json()
    assert listed == {"generated_text": record["output"]["text"]}
    _, events = await tgi_stream(client, "/", {**body, "stream": True})
    assert events[-1]["generated_text"] == listed["generated_text"]
    assert events[-1]["details"] is None


async def test_a_job_cancelled_elsewhere_ends_the_stream_with_an_incomplete_generation_error(
    client: httpx.AsyncClient,
) -> None:
    async with (
        asyncio.timeout(JOB_DEADLINE_SECONDS),
        aconnect_sse(client, "POST", "/generate_stream", json=LONG_JOB) as source,
    ):
        job_id = source.response.headers[JOB_ID]
        events = source.aiter_sse()
        first = json.loads((await anext(events)).data)
        assert (await client.post(f"/v1/jobs/{job_id}/cancel")).status_code == 202
        rest = [json.loads(sse.data) async for sse in events if sse.data]
    # huggingface_hub raises IncompleteGenerationError for this error type
    assert rest[-1] == {"error": "the job was cancelled", "error_type": "incomplete_generation"}
    record = await wait_for_status(client, job_id, {"cancelled"})
    assert record["output"]["token_count"] == len([first, *rest]) - 1


async def test_a_client_leaving_mid_stream_cancels_its_job(client: httpx.AsyncClient) -> None:
    async with client.stream("POST", "/generate_stream", json=LONG_JOB) as response:
        job_id = response.headers[JOB_ID]
        lines = response.aiter_lines()
        seen = 0
        while seen < 3:
            seen += (await anext(lines)).startswith("data:")
    record = await wait_for_status(client, job_id, {"cancelled", "completed", "failed"})
    assert record["status"] == "cancelled"
    assert 3 <= record["output"]["token_count"] < 500


async def test_info_describes_the_served_model_and_its_limits(
    system: System, client: httpx.AsyncClient
) -> None:
    info = (await client.get("/info")).json()
    models = (await client.get("/v1/models")).json()["data"]
    assert info["model_id"] == models[0]["id"] == system.settings.model_name
    assert info["max_total_tokens"] == system.settings.max_model_len
    assert info["max_input_tokens"] == info["max_input_length"] == system.settings.max_model_len - 1
    assert (info["router"], info["max_best_of"], info["max_stop_sequences"]) == ("streampool", 1, 16)
    assert info["workers"] == WORKERS
    with InferenceClient(system.base_url, provider="hf-inference") as hf:
        assert hf.get_endpoint_info() == info
