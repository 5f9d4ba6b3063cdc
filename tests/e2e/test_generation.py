"""Generation end to end: gateway, queue, a real worker with the real engine, and back."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

import httpx

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
    """The engine's seeds, checked here once: the OpenAI and TGI routes hand `seed` on to the job
    (tests/gateway/test_openai_compat.py, test_tgi_compat.py)."""
    body = {"prompt": "A short poem about the sea:", "max_tokens": 24, "temperature": 0.9, "seed": 1234}
    runs = []
    for _ in range(2):
        job_id = await submit(client, **body)
        runs.append(await wait_for_status(client, job_id, {"completed"}))
    assert runs[0]["output"]["text"] == runs[1]["output"]["text"] != ""
    other = await wait_for_status(client, await submit(client, **{**body, "seed": 99}), {"completed"})
    assert other["output"]["text"] != runs[0]["output"]["text"]


async def test_logprobs_come_with_their_tokens(client: httpx.AsyncClient) -> None:
    """The engine's logprobs, checked here once; OpenAI's and TGI's shapes of them are the gateway's
    (test_openai_routes.py, tests/gateway/test_openai_compat.py and test_tgi_compat.py)."""
    job_id = await submit(client, prompt="Hello", max_tokens=6, logprobs=2, temperature=0)
    events = [event for _, event in await read_sse(client, job_id)]
    for event in deltas(events):
        assert [lp["token_id"] for lp in event["logprobs"]] == event["token_ids"]
        for lp in event["logprobs"]:
            assert lp["logprob"] <= 0
            assert 1 <= len(lp["top_logprobs"]) <= 3
            # temperature 0: the sampled token is the most likely one, with its own logprob
            top = lp["top_logprobs"]
            assert top[0]["token_id"] == lp["token_id"] and top[0]["logprob"] == lp["logprob"]
            assert lp["logprob"] == max(alternative["logprob"] for alternative in top)
    logprobs = [lp for event in deltas(events) for lp in event["logprobs"]]
    assert len(logprobs) == events[-1]["usage"]["completion_tokens"] > 0
