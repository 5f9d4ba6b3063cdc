"""Deadlines: a job still queued when its deadline passes fails with `deadline_exceeded` unrun.

The subject is the queue: the workers run the synthetic engine (the session's synthetic system).
"""

from __future__ import annotations

import time

import httpx

from tests.helpers import poll_all, submit, wait_for_status


async def test_a_job_whose_deadline_passed_fails_with_deadline_exceeded_without_running(
    synthetic_client: httpx.AsyncClient,
) -> None:
    job_id = await submit(
        synthetic_client, prompt="The capital of France is", max_tokens=4, deadline="2020-01-01T00:00:00Z"
    )
    job = await wait_for_status(synthetic_client, job_id, {"completed", "cancelled", "failed"})
    assert (job["status"], job["started_at"], job["attempts"]) == ("failed", None, 0)
    events = await poll_all(synthetic_client, job_id)
    assert [(event["type"], event.get("state")) for event in events] == [
        ("status", "queued"),
        ("error", None),
    ]
    assert events[-1]["code"] == "deadline_exceeded"


async def test_a_deadline_in_unix_seconds_still_ahead_lets_the_job_run(
    synthetic_client: httpx.AsyncClient,
) -> None:
    deadline = time.time() + 600
    job_id = await submit(
        synthetic_client, prompt="The capital of France is", max_tokens=4, temperature=0, deadline=deadline
    )
    job = await wait_for_status(synthetic_client, job_id, {"completed", "cancelled", "failed"})
    assert (job["status"], job["attempts"]) == ("completed", 1)
