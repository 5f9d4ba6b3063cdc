"""text-generation-inference's API end to end on the real engine, with `huggingface_hub`'s real clients
and raw HTTP.

Greedy decoding (TGI's default) makes a second run give the same text, so what a client
assembles can be checked against the job record of another run of the same request. What the
gateway's TGI routes make of a job whatever the engine (`/info`, `POST /`, seeds reported, a job
that ends early) is in test_tgi_routes.py, on a synthetic system; their refusals are in
tests/gateway/test_client_refusals.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from huggingface_hub import AsyncInferenceClient, InferenceClient

from tests.conftest import System
from tests.helpers import JOB_DEADLINE_SECONDS, tgi_stream

PROMPT = "The capital of France is"
JOB_ID = "X-Streampool-Job-Id"


def generate(system: System, prompt: str, **parameters: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """`POST /generate` over plain HTTP: the answer, and the record of the job its header names."""
    answer = httpx.post(
        f"{system.base_url}/generate", json={"inputs": prompt, "parameters": parameters}, timeout=120
    )
    assert answer.status_code == 200, answer.text
    record = httpx.get(f"{system.base_url}/v1/jobs/{answer.headers[JOB_ID]}").json()
    return answer.json(), record


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


async def test_a_stop_sequence_ends_the_stream_as_tgi_says(client: httpx.AsyncClient) -> None:
    """A stop string as vLLM applies it, checked here once: the job's record, and TGI's finish reason,
    which the gateway tells from the end of sequence by the text vLLM leaves."""
    body = {
        "inputs": "List: apple, banana, cherry, date,",
        "parameters": {"max_new_tokens": 32, "stop": [","], "details": True},
    }
    job_id, events = await tgi_stream(client, "/generate_stream", body)
    record = (await client.get(f"/v1/jobs/{job_id}")).json()
    assert record["finish_reason"] == "stop"
    assert events[-1]["details"]["finish_reason"] == "stop_sequence"
    assert events[-1]["token"]["special"] is False
    assert "".join(event["token"]["text"] for event in events) == record["output"]["text"]
    assert "," not in record["output"]["text"]
