"""vLLM's tokens-in/tokens-out route on the real engine: the token ids a prompt's ids give, whole and
streamed, are the engine's own, the ones `/v1/completions` gets for the same ids. The answers' shapes,
parsed with vLLM's own protocol models, are held in tests/gateway/test_scale_out_compat.py (importing vLLM
here would cost this process seconds); what the route makes of a job whatever the engine is in
test_scale_out_routes.py, on a synthetic system."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.conftest import System
from tests.helpers import LONG_PROMPT, poll_all, streamed_token_ids

JOB_ID_HEADER = "X-Streampool-Job-Id"
MAX_TOKENS = 12


async def _stream(client: httpx.AsyncClient, body: dict[str, Any]) -> list[str]:
    async with client.stream("POST", "/inference/v1/generate", json={**body, "stream": True}) as answer:
        assert answer.status_code == 200, (await answer.aread()).decode()
        return [
            line.removeprefix("data: ") async for line in answer.aiter_lines() if line.startswith("data: ")
        ]


async def test_generate_gives_the_engines_tokens_whole_and_streamed_as_completions_does(
    client: httpx.AsyncClient, system: System
) -> None:
    model = system.settings.model_name
    ids = (await client.post("/tokenize", json={"model": model, "prompt": LONG_PROMPT})).json()["tokens"]
    body = {"model": model, "token_ids": ids, "sampling_params": {"max_tokens": MAX_TOKENS, "temperature": 0}}

    answer = await client.post("/inference/v1/generate", json=body)
    assert answer.status_code == 200, answer.text
    (choice,) = answer.json()["choices"]
    assert len(choice["token_ids"]) == MAX_TOKENS and answer.json()["usage"]["prompt_tokens"] == len(ids)

    *data, done = await _stream(client, {**body, "stream_options": {"include_usage": True}})
    chunks = [json.loads(one) for one in data]
    assert done == "[DONE]" and chunks[-1]["usage"]["completion_tokens"] == MAX_TOKENS
    streamed = [token for chunk in chunks for each in chunk["choices"] for token in each["token_ids"]]
    assert streamed == choice["token_ids"]

    text = await client.post("/inference/v1/generate", json={**body, "output_mode": "text"})
    completion = await client.post(
        "/v1/completions", json={"model": model, "prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0}
    )
    assert completion.status_code == 200, completion.text
    events = await poll_all(client, completion.headers[JOB_ID_HEADER])
    assert streamed_token_ids(events) == choice["token_ids"]  # the completion's job generated the same ids
    assert completion.json()["choices"][0]["text"] == text.json()["choices"][0]["text"] != ""
