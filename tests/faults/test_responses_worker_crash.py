"""A worker SIGKILLed mid-response: another worker resumes the job from its stream, and a client of the
background response, its stream dropped with the kill and resumed with `starting_after`, sees one
sequence of events (a second `response.in_progress` where the other worker took over)."""

from __future__ import annotations

from typing import Any

import httpx
import openai

from tests.faults.conftest import WAIT_TIMEOUT, Pool, wait_for_tokens
from tests.helpers import LONG_PROMPT


async def test_a_background_response_whose_worker_is_killed_goes_on_as_one_sequence(
    pool: Pool, client: httpx.AsyncClient
) -> None:
    pool.ensure_workers()
    async with openai.AsyncOpenAI(
        base_url=f"{pool.base_url}/v1", api_key="none", max_retries=0, timeout=WAIT_TIMEOUT
    ) as sdk:
        stream = await sdk.responses.create(
            model=pool.settings.model_name,
            input=LONG_PROMPT,
            background=True,
            stream=True,
            max_output_tokens=200,
            temperature=0,
        )
        first: list[Any] = []
        async for event in stream:
            first.append(event)
            if event.type == "response.output_text.delta":
                break
        await stream.close()
        job_id = first[0].response.id.removeprefix("resp_")
        running = await wait_for_tokens(client, job_id, 10)
        pool.processes.kill(pool.worker_named(running["worker"]))  # with its engine core

        resumed = await sdk.responses.retrieve(
            first[0].response.id, stream=True, starting_after=first[-1].sequence_number
        )
        rest = [event async for event in resumed]

    events = first + rest
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert [event.type for event in events].count("response.in_progress") == 2
    final = rest[-1]
    assert final.type in ("response.completed", "response.incomplete")
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    record = (await client.get(f"/v1/jobs/{job_id}")).json()
    assert (record["status"], record["attempts"]) == ("completed", 2)
    assert text == final.response.output_text == record["output"]["text"]
