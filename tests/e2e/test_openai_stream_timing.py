"""Through the `openai` client, against workers that generate: a stream's first chunk comes with the
job's first token, and continuous usage counts as the job record does.

The subject is when the gateway sends, not what the engine generates: the workers run the synthetic
engine. The first token's time is its `delta` entry's `at` (Redis's clock, in milliseconds), on the
same machine as the client's clock.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import openai
import pytest
import redis

from tests.conftest import System
from tests.helpers import job_record

JOB_ID_HEADER = "X-Streampool-Job-Id"
QUESTION = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def system(synthetic_system: System) -> System:
    return synthetic_system


def _first_delta_ms(system: System, job_id: str) -> int:
    with redis.Redis.from_url(system.settings.redis_url, decode_responses=True) as client:
        entries = client.xrange(system.keys.stream(job_id))
    return next(int(fields["at"]) for _, fields in entries if fields["type"] == "delta")


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completion"])
def test_the_first_chunk_arrives_after_the_jobs_first_token(
    sync_openai: openai.OpenAI, system: System, chat: bool
) -> None:
    options: dict[str, Any] = {"model": system.settings.model_name, "max_tokens": 8, "stream": True}
    create: Any = sync_openai.chat.completions if chat else sync_openai.completions
    body = {"messages": QUESTION} if chat else {"prompt": "The three primary colours are"}
    with create.with_streaming_response.create(**options, **body) as response:
        job_id = response.headers[JOB_ID_HEADER]
        first_chunk_ms = None
        for _ in response.parse():
            first_chunk_ms = first_chunk_ms or time.time() * 1000
    assert first_chunk_ms is not None
    record = job_record(system.base_url, job_id)
    assert record["status"] == "completed"
    assert first_chunk_ms >= datetime.fromisoformat(record["started_at"]).timestamp() * 1000
    assert first_chunk_ms >= _first_delta_ms(system, job_id)


def test_continuous_usage_counts_as_the_job_record(sync_openai: openai.OpenAI, system: System) -> None:
    with sync_openai.chat.completions.with_streaming_response.create(
        model=system.settings.model_name,
        messages=[{"role": "user", "content": "Name three colours."}],
        max_tokens=12,
        stream=True,
        extra_body={"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    ) as response:
        job_id = response.headers[JOB_ID_HEADER]
        chunks = list(response.parse())
    record = job_record(system.base_url, job_id)
    usages = [chunk.usage for chunk in chunks]
    assert all(usage is not None for usage in usages)
    completion = [usage.completion_tokens for usage in usages if usage is not None]
    assert completion == sorted(completion) and completion[0] == 0
    assert completion[-1] == record["usage"]["completion_tokens"] == record["output"]["token_count"]
    assert {usage.prompt_tokens for usage in usages if usage is not None} == {
        record["usage"]["prompt_tokens"]
    }
