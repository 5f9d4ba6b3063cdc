"""Generation end to end: gateway, queue, a real worker with the real engine, and back."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

import httpx
import redis.asyncio as aioredis

from tests.conftest import System
from tests.helpers import deltas, read_sse, streamed_text, streamed_token_ids, submit, wait_for_status

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@cache
def tokenizer(model: str) -> PreTrainedTokenizerBase:
    """Imported here, not at the top: every test process collects this module, and transformers
    (with torch) takes seconds to import; only the process that runs these tests needs it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


async def test_streamed_text_equals_the_record_and_usage_is_exact(
    client: httpx.AsyncClient, system: System
) -> None:
    prompt = "The three primary colors are"
    job_id = await submit(client, prompt=prompt, max_tokens=24, temperature=0)
    events = [event for _, event in await read_sse(client, job_id)]
    record = (await client.get(f"/v1/jobs/{job_id}")).json()

    assert [event["seq"] for event in events] == list(range(len(events)))
    assert [(e["type"], e.get("state")) for e in events[:2]] == [("status", "queued"), ("status", "running")]
    done = events[-1]
    assert done["type"] == "done" and done["finish_reason"] in {"stop", "length"}
    assert record["status"] == "completed"
    assert record["output"]["text"] == streamed_text(events) != ""
    assert (
        record["output"]["token_count"]
        == len(streamed_token_ids(events))
        == done["usage"]["completion_tokens"]
    )
    assert record["usage"] == done["usage"]
    assert done["usage"]["prompt_tokens"] == len(tokenizer(str(system.settings.model)).encode(prompt))
    assert record["finish_reason"] == done["finish_reason"]
    assert record["started_at"] >= record["created_at"] and record["finished_at"] >= record["started_at"]


async def test_chat_messages_use_the_model_chat_template(client: httpx.AsyncClient, system: System) -> None:
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    job_id = await submit(client, messages=messages, max_tokens=16, temperature=0)
    events = [event for _, event in await read_sse(client, job_id)]
    chat = tokenizer(str(system.settings.model)).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    expected_prompt_tokens = len(tokenizer(str(system.settings.model)).encode(chat, add_special_tokens=False))
    assert events[-1]["type"] == "done"
    assert events[-1]["usage"]["prompt_tokens"] == expected_prompt_tokens
    assert "paris" in streamed_text(events).lower()


async def test_stream_step_coalesces_tokens_into_chunks(client: httpx.AsyncClient) -> None:
    job_id = await submit(
        client, prompt="Count with me: one, two, three,", max_tokens=23, stream_step=4, temperature=0
    )
    events = [event for _, event in await read_sse(client, job_id)]
    sizes = [len(event["token_ids"]) for event in deltas(events)]
    assert sizes, events
    assert all(size >= 4 for size in sizes[:-1]), sizes
    assert sum(sizes) == events[-1]["usage"]["completion_tokens"]


async def test_same_seed_gives_the_same_text(client: httpx.AsyncClient) -> None:
    body = {"prompt": "A short poem about the sea:", "max_tokens": 24, "temperature": 0.9, "seed": 1234}
    runs = []
    for _ in range(2):
        job_id = await submit(client, **body)
        runs.append(await wait_for_status(client, job_id, {"completed"}))
    assert runs[0]["output"]["text"] == runs[1]["output"]["text"] != ""
    other = await wait_for_status(client, await submit(client, **{**body, "seed": 99}), {"completed"})
    assert other["output"]["text"] != runs[0]["output"]["text"]


async def test_logprobs_come_with_their_tokens(client: httpx.AsyncClient) -> None:
    job_id = await submit(client, prompt="Hello", max_tokens=6, logprobs=2, temperature=0)
    for event in deltas([event for _, event in await read_sse(client, job_id)]):
        assert [lp["token_id"] for lp in event["logprobs"]] == event["token_ids"]
        for lp in event["logprobs"]:
            assert lp["logprob"] <= 0
            assert 1 <= len(lp["top_logprobs"]) <= 3
            # temperature 0: the sampled token is the most likely one
            assert lp["top_logprobs"][0]["token_id"] == lp["token_id"]


async def test_stop_string_ends_generation(client: httpx.AsyncClient) -> None:
    job_id = await submit(
        client, prompt="List: apple, banana, cherry, date,", max_tokens=40, temperature=0, stop=","
    )
    record = await wait_for_status(client, job_id, {"completed"})
    assert record["finish_reason"] == "stop"
    assert "," not in record["output"]["text"]


async def test_prompt_longer_than_the_context_is_refused_with_the_numbers_before_any_job(
    client: httpx.AsyncClient, system: System, redis_client: aioredis.Redis
) -> None:
    jobs_before = await _job_keys(redis_client, system)
    answer = await client.post("/v1/jobs", json={"prompt": "word " * 3000, "max_tokens": 16})
    assert answer.status_code == 413, answer.text
    body = answer.json()
    assert body["error_type"] == "prompt_too_long"
    assert body["max_tokens"] == 16 and body["context_length"] == system.settings.max_model_len == 2048
    assert body["prompt_tokens"] > 2048 - 16
    assert str(body["prompt_tokens"]) in body["error"] and "2048" in body["error"]
    assert await _job_keys(redis_client, system) == jobs_before


async def _job_keys(redis_client: aioredis.Redis, system: System) -> set[str]:
    return {name async for name in redis_client.scan_iter(match=system.keys.job("*"), count=1000)}
