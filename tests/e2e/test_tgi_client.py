"""text-generation-inference's API end to end, with `huggingface_hub`'s real clients and raw HTTP.

Greedy decoding (TGI's default) makes a second run give the same text, so what a client
assembles can be checked against the job record of another run of the same request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse
from huggingface_hub import AsyncInferenceClient, InferenceClient
from huggingface_hub.errors import HfHubHTTPError, ValidationError

from tests.conftest import WORKERS, System
from tests.helpers import JOB_DEADLINE_SECONDS, wait_for_status

PROMPT = "The capital of France is"
COUNTING = "Count to one thousand: 1, 2, 3, 4, 5, 6,"  # greedy decoding keeps counting
JOB_ID = "X-Streampool-Job-Id"


@pytest.fixture
def hf(system: System) -> Iterator[InferenceClient]:
    with InferenceClient(system.base_url) as client:
        yield client


@pytest.fixture
async def async_hf(system: System) -> AsyncIterator[AsyncInferenceClient]:
    async with AsyncInferenceClient(system.base_url) as client:
        yield client


def generate(system: System, prompt: str, **parameters: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """`POST /generate` over plain HTTP: the answer, and the record of the job its header names."""
    answer = httpx.post(
        f"{system.base_url}/generate", json={"inputs": prompt, "parameters": parameters}, timeout=120
    )
    assert answer.status_code == 200, answer.text
    record = httpx.get(f"{system.base_url}/v1/jobs/{answer.headers[JOB_ID]}").json()
    return answer.json(), record


async def stream(
    client: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> tuple[str, list[dict[str, Any]]]:
    """The job id and every event of a TGI stream."""
    async with asyncio.timeout(JOB_DEADLINE_SECONDS), aconnect_sse(client, "POST", path, json=body) as source:
        assert source.response.status_code == 200, await source.response.aread()
        events = [json.loads(sse.data) async for sse in source.aiter_sse() if sse.data]
    return source.response.headers[JOB_ID], events


def tgi_finish_reason(record: dict[str, Any]) -> set[str]:
    """The TGI finish reasons that can stand for the job's (vLLM says `stop` for EOS and stop strings)."""
    return {"length"} if record["finish_reason"] == "length" else {"eos_token", "stop_sequence"}


def test_inference_client_streams_token_texts_that_join_to_the_job_text(
    system: System, hf: InferenceClient
) -> None:
    texts = list(hf.text_generation(PROMPT, max_new_tokens=16, stream=True))
    answer, record = generate(system, PROMPT, max_new_tokens=16)
    assert all(isinstance(text, str) for text in texts)
    assert "".join(texts) == record["output"]["text"] == answer["generated_text"] != ""
    assert len(texts) == record["usage"]["completion_tokens"]


def test_inference_client_details_match_the_job_record(system: System, hf: InferenceClient) -> None:
    output = hf.text_generation(PROMPT, max_new_tokens=16, details=True)
    answer, record = generate(system, PROMPT, max_new_tokens=16, details=True)
    details = output.details
    assert details is not None
    assert output.generated_text == record["output"]["text"] == answer["generated_text"]
    assert details.generated_tokens == record["usage"]["completion_tokens"] == len(details.tokens)
    assert details.finish_reason in tgi_finish_reason(record)
    assert details.seed is None  # greedy
    assert "".join(token.text for token in details.tokens) == output.generated_text
    assert [token.id for token in details.tokens] == [token["id"] for token in answer["details"]["tokens"]]
    assert all(token.logprob <= 0 for token in details.tokens)


def test_return_full_text_prepends_the_prompt(hf: InferenceClient) -> None:
    text = hf.text_generation(PROMPT, max_new_tokens=4)
    assert hf.text_generation(PROMPT, max_new_tokens=4, return_full_text=True) == PROMPT + text


async def test_async_client_stream_with_details_ends_with_the_text_and_details(
    system: System, async_hf: AsyncInferenceClient
) -> None:
    async with asyncio.timeout(JOB_DEADLINE_SECONDS):
        outputs = [
            output
            async for output in await async_hf.text_generation(
                PROMPT, max_new_tokens=12, stream=True, details=True
            )
        ]
    *tokens, last = outputs
    answer, record = generate(system, PROMPT, max_new_tokens=12)
    assert [output.index for output in outputs] == list(range(1, len(outputs) + 1))
    assert all(output.generated_text is None and output.details is None for output in tokens)
    assert last.generated_text == "".join(output.token.text for output in outputs) == record["output"]["text"]
    assert last.details is not None
    assert last.details.generated_tokens == len(outputs) == record["usage"]["completion_tokens"]
    assert last.details.input_length == record["usage"]["prompt_tokens"]
    assert last.details.finish_reason in tgi_finish_reason(record)
    assert all(output.token.logprob <= 0 and output.token.id >= 0 for output in outputs)


async def test_same_seed_samples_the_same_text(async_hf: AsyncInferenceClient) -> None:
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
    job_id, events = await stream(client, "/generate_stream", body)
    record = (await client.get(f"/v1/jobs/{job_id}")).json()
    assert record["status"] == "completed"
    assert events[-1]["generated_text"] == "".join(event["token"]["text"] for event in events)
    assert events[-1]["generated_text"] == record["output"]["text"]
    assert events[-1]["details"]["generated_tokens"] == len(events) == record["usage"]["completion_tokens"]
    assert events[-1]["details"]["input_length"] == record["usage"]["prompt_tokens"]
    assert [event["index"] for event in events] == list(range(1, len(events) + 1))


async def test_a_stop_sequence_ends_the_stream_as_tgi_says(client: httpx.AsyncClient) -> None:
    body = {
        "inputs": "List: apple, banana, cherry, date,",
        "parameters": {"max_new_tokens": 32, "stop": [","], "details": True},
    }
    job_id, events = await stream(client, "/generate_stream", body)
    record = (await client.get(f"/v1/jobs/{job_id}")).json()
    assert record["finish_reason"] == "stop"
    assert events[-1]["details"]["finish_reason"] == "stop_sequence"
    assert events[-1]["token"]["special"] is False
    assert "".join(event["token"]["text"] for event in events) == record["output"]["text"]
    assert "," not in record["output"]["text"]


async def test_root_route_answers_as_generate_or_generate_stream_by_the_stream_flag(
    client: httpx.AsyncClient,
) -> None:
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 6}}
    answer = await client.post("/", json=body)
    assert answer.status_code == 200
    [listed] = answer.json()  # TGI's `POST /` lists its answer, as the Inference API did
    record = (await client.get(f"/v1/jobs/{answer.headers[JOB_ID]}")).json()
    assert listed == {"generated_text": record["output"]["text"]}
    _, events = await stream(client, "/", {**body, "stream": True})
    assert events[-1]["generated_text"] == listed["generated_text"]
    assert events[-1]["details"] is None


@pytest.mark.parametrize(
    ("parameters", "name"),
    [
        ({"repetition_penalty": 1.3}, "repetition_penalty"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"truncate": 8}, "truncate"),
        ({"details": True, "decoder_input_details": True}, "decoder_input_details"),
        ({"watermark": True}, "watermark"),
        ({"best_of": 2, "do_sample": True}, "best_of"),
        ({"typical_p": 0.5}, "typical_p"),
        ({"top_n_tokens": 3}, "top_n_tokens"),
        ({"grammar": {"type": "regex", "value": "[0-9]+"}}, "grammar"),
    ],
)
def test_unsupported_parameters_raise_the_client_validation_error(
    hf: InferenceClient, parameters: dict[str, Any], name: str
) -> None:
    with pytest.raises(ValidationError, match=f"parameters.{name}:") as refused:
        hf.text_generation(PROMPT, max_new_tokens=4, **parameters)
    cause = refused.value.__cause__
    assert isinstance(cause, HfHubHTTPError) and cause.response.status_code == 422


def test_a_prompt_longer_than_the_context_is_a_validation_error(hf: InferenceClient) -> None:
    prompt = "word " * 3000
    with pytest.raises(ValidationError, match="2048") as refused:
        hf.text_generation(prompt, max_new_tokens=4)
    cause = refused.value.__cause__
    assert isinstance(cause, HfHubHTTPError) and cause.response.status_code == 422
    with pytest.raises(ValidationError, match="2048"):  # from the stream's error event
        list(hf.text_generation(prompt, max_new_tokens=4, stream=True))


async def test_a_job_cancelled_elsewhere_ends_the_stream_with_an_incomplete_generation_error(
    client: httpx.AsyncClient,
) -> None:
    body = {"inputs": COUNTING, "parameters": {"max_new_tokens": 500}}
    async with (
        asyncio.timeout(JOB_DEADLINE_SECONDS),
        aconnect_sse(client, "POST", "/generate_stream", json=body) as source,
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
    body = {"inputs": COUNTING, "parameters": {"max_new_tokens": 500}}
    async with client.stream("POST", "/generate_stream", json=body) as response:
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
