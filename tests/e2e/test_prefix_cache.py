"""Prefix-aware claiming on the real engine: a conversation's turns, each sent once the last answer has
ended, run on the worker whose vLLM cache holds their prefix, and vLLM's own counter of prefix-cache
hits (`vllm:prefix_cache_hits_total`, in tokens) rises by at least the shared prefix's full blocks at
every turn after the first: the gateway's block hashes, the worker's and vLLM's agree.

On the session's system of two real workers; figures are read before and after, once idle.
"""

from __future__ import annotations

import httpx
import openai

from gateway.generation import JOB_ID_HEADER
from tests.conftest import System
from tests.e2e.test_vllm_metrics import WAIT_SECONDS, idle_workers, scrape_workers, total
from tests.helpers import Scrape, eventually, record

SYSTEM_PROMPT = "You are a patient tutor who explains the tides, the winds and the currents. " * 20
TURNS = 3
HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"


async def test_a_conversation_runs_where_its_prefix_is_cached_and_vllm_counts_the_hits(
    client: httpx.AsyncClient, system: System
) -> None:
    model = {"model_name": system.settings.model_name}
    card = (await client.get("/v1/models")).json()["data"][0]["id"]
    block = 128  # vLLM's default cache block on the CPU (its card says the same: below)
    async with openai.AsyncOpenAI(
        base_url=f"{system.base_url}/v1", api_key="none", max_retries=0
    ) as openai_client:
        tokenized = await client.post("/tokenize", json={"model": card, "prompt": SYSTEM_PROMPT})
        full_blocks = tokenized.json()["count"] // block
        assert full_blocks >= 2
        messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM_PROMPT}]
        workers, hits = [], []
        for turn in range(TURNS):
            before = await idle_workers(client, system)
            messages.append({"role": "user", "content": f"Question {turn}: why are there tides?"})
            answer = await openai_client.chat.completions.with_raw_response.create(
                model=card,
                messages=messages,
                max_tokens=8,
                temperature=0,  # type: ignore[arg-type]
            )
            messages.append({"role": "assistant", "content": answer.parse().choices[0].message.content or ""})
            workers.append((await record(client, answer.headers[JOB_ID_HEADER]))["worker"])

            def queried(now: list[Scrape], before: list[Scrape] = before) -> bool:
                """vLLM records a step's stats just after its outputs."""
                return total(now, QUERIES, **model) > total(before, QUERIES, **model)

            after = await eventually(
                lambda: scrape_workers(client, system),
                "vLLM counts the turn",
                WAIT_SECONDS,
                0.2,
                until=queried,
            )
            hits.append(total(after, HITS, **model) - total(before, HITS, **model))
    assert workers[0] is not None and workers == [workers[0]] * TURNS, workers
    assert all(moved >= full_blocks * block for moved in hits[1:]), (hits, full_blocks)
