"""The job runner against the real Redis, for engine faults the real engine cannot be made to show,
and for resumes, whose exact prompt and token budget only a scripted engine can report.

`ScriptedEngine` is a test double: it plays back a fixed list of engine outputs, so a test
can have the engine abort a request on its own or fail to render a prompt, and it records
what it was asked to generate. Every normal path (and crashes of real workers) runs on the
real engine in tests/e2e and tests/faults.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import pytest

from shared.events import DeltaEvent, JobState, event_adapter
from shared.jobstore import JobStore
from shared.lifecycle.transitions import ReleaseOutcome, Verdict
from shared.pooling import PoolingJob
from shared.requests import JobRequest
from worker.adapters import Adapters
from worker.engine import Adapter, Engine, EngineDelta, Prompt, Serving
from worker.jobs import Ending, JobRunner
from worker.leases import Leases
from worker.metrics import WorkerMetrics
from worker.publisher import Publisher

RUNNER = "worker-1"
LEASE_SECONDS = 6.0


class ScriptedEngine:
    model_name = "scripted"
    max_model_len = 512
    max_chars_per_token = 16

    def __init__(
        self,
        outputs: list[EngineDelta],
        render_error: Exception | None = None,
        between_steps: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.outputs = outputs
        self.render_error = render_error
        self.between_steps = between_steps
        self.prompts: list[Prompt] = []
        self.aborted: list[str] = []

    def render(self, request: JobRequest) -> Prompt:
        if self.render_error is not None:
            raise self.render_error
        return Prompt(token_ids=[1, 2, 3], request=request)

    async def generate(self, request_id: str, prompt: Prompt) -> AsyncGenerator[EngineDelta, None]:
        self.prompts.append(prompt)
        for number, output in enumerate(self.outputs):
            if number and self.between_steps is not None:
                await self.between_steps()
            yield output

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def add_adapter(self, adapter: Adapter) -> None:
        raise AssertionError("no test of this module loads an adapter")

    async def remove_adapter(self, adapter: Adapter) -> None:
        raise AssertionError("no test of this module loads an adapter")

    async def serving(self) -> Serving:
        return Serving(generates=True)

    async def pool(self, request_id: str, job: PoolingJob) -> dict[str, Any]:
        raise AssertionError("no test of this module pools")

    def running_requests(self) -> int:
        return 0

    @property
    def dead(self) -> bool:
        return False

    def shutdown(self) -> None:
        pass


def runner(store: JobStore, engine: Engine, worker_id: str = RUNNER) -> JobRunner:
    publisher = Publisher(store.redis, store, worker_id)
    return JobRunner(
        engine,
        store,
        publisher,
        Leases(store, store.settings),
        worker_id,
        metrics=WorkerMetrics("scripted"),
        engine_died=lambda: None,
        adapters=Adapters(engine, store.redis, store.keys, "scripted", {}),
    )


async def stream(store: JobStore, job_id: str) -> list[dict[str, object]]:
    entries = await store.redis.xrange(store.keys.stream(job_id))
    return [event_adapter.validate_json(fields["data"]).model_dump() for _, fields in entries]


async def run(
    store: JobStore, engine: ScriptedEngine, **request: object
) -> tuple[str, list[dict[str, object]]]:
    job_id = (
        await store.submit(
            JobRequest.model_validate({"prompt": "hi", **request}), model="scripted", max_queued=0
        )
    ).job_id
    await runner(store, engine).run(job_id)
    return job_id, await stream(store, job_id)


async def handed_back_after(store: JobStore, tokens: list[tuple[str, int]], **request: object) -> str:
    """A job whose first run (worker-0) emitted `tokens` (text, id) and then handed it back."""
    job_id = (
        await store.submit(
            JobRequest.model_validate({"prompt": "hi", **request}), model="scripted", max_queued=0
        )
    ).job_id
    assert await store.start(job_id, "worker-0", "scripted", lease_seconds=LEASE_SECONDS) is not None
    first_run = Publisher(store.redis, store, "worker-0")
    deltas = [DeltaEvent(seq=2 + n, text=text, token_ids=[token]) for n, (text, token) in enumerate(tokens)]
    assert await first_run.step(job_id, deltas) is Verdict.go
    assert (
        await Leases(store, store.settings).release(job_id, "scripted", "its worker shut down", "worker-0")
        is ReleaseOutcome.requeued
    )
    return job_id


async def test_an_abort_inside_the_engine_fails_the_job_and_keeps_its_tokens(store: JobStore) -> None:
    engine = ScriptedEngine(
        [
            EngineDelta(text="a", token_ids=[7]),
            EngineDelta(text="b", token_ids=[8], finished=True, finish_reason="abort"),
        ]
    )
    job_id, events = await run(store, engine, stream_step=4)
    assert [event["type"] for event in events] == ["status", "status", "delta", "error"]
    assert events[2]["token_ids"] == [7, 8]
    assert events[-1]["code"] == "engine_error"
    record = await store.record(job_id)
    assert (record.status.value, record.output.token_count, record.output.text) == ("failed", 2, "ab")


async def test_a_prompt_that_cannot_be_rendered_fails_the_job_instead_of_leaving_it_running(
    store: JobStore,
) -> None:
    engine = ScriptedEngine([], render_error=ValueError("this template has no 'system' role"))
    job_id, events = await run(store, engine)
    assert events[-1]["type"] == "error" and events[-1]["code"] == "internal"
    assert "system" in str(events[-1]["message"])
    assert (await store.record(job_id)).status.value == "failed"


async def test_a_prompt_that_leaves_no_room_for_max_tokens_fails_with_prompt_too_long(
    store: JobStore,
) -> None:
    job_id, events = await run(store, ScriptedEngine([]), max_tokens=510)
    assert events[-1]["code"] == "prompt_too_long"
    assert "room for 2" in str(events[-1]["message"])
    record = await store.record(job_id)
    assert record.usage is not None and record.usage.prompt_tokens == 3


async def test_a_resumed_job_goes_on_from_the_tokens_its_stream_holds(store: JobStore) -> None:
    job_id = await handed_back_after(store, [("a", 7), ("b", 8)], max_tokens=5)
    engine = ScriptedEngine(
        [
            EngineDelta(text="c", token_ids=[9]),
            EngineDelta(text="d", token_ids=[10], finished=True, finish_reason="length"),
        ]
    )
    assert await runner(store, engine).run(job_id) is Ending.ended

    (prompt,) = engine.prompts
    assert (prompt.token_ids, prompt.request.max_tokens) == ([1, 2, 3, 7, 8], 3)
    events = await stream(store, job_id)
    assert [event["seq"] for event in events] == list(range(len(events)))
    assert [event["type"] for event in events] == [
        "status",
        "status",
        "delta",
        "delta",
        "status",
        "delta",
        "delta",
        "done",
    ]
    resumed = events[4]
    assert (resumed["state"], resumed["resumed"], resumed["attempt"]) == ("running", True, 2)
    assert events[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4}
    record = await store.record(job_id)
    assert (record.status, record.attempts, record.output.text, record.worker) == (
        JobState.completed,
        2,
        "abcd",
        RUNNER,
    )


async def test_a_handed_back_job_cancelled_meanwhile_ends_at_once_and_is_not_run_again(
    store: JobStore,
) -> None:
    job_id = await handed_back_after(store, [("a", 7)])
    await store.cancel(job_id)  # no worker holds it: it ends now, with the output its stream holds
    record = await store.record(job_id)
    assert (record.status, record.output.text) == (JobState.cancelled, "a")
    engine = ScriptedEngine([EngineDelta(text="never", token_ids=[99], finished=True, finish_reason="stop")])
    assert await runner(store, engine).run(job_id) is Ending.ended
    assert engine.prompts == []
    events = await stream(store, job_id)
    assert [event["type"] for event in events] == ["status", "status", "delta", "cancelled"]
    # the prompt's tokens are counted by a worker that renders it: none did since
    assert events[-1]["usage"] == {"prompt_tokens": 0, "completion_tokens": 1}


async def test_a_run_whose_lease_was_taken_stops_writing_and_leaves_the_job_to_the_queue(
    store: JobStore,
) -> None:
    job_id = (
        await store.submit(JobRequest(prompt="hi", max_tokens=8), model="scripted", max_queued=0)
    ).job_id

    async def lease_lapses() -> None:
        await store.redis.delete(store.keys.lease(job_id))

    outputs = [EngineDelta(text=t, token_ids=[n]) for n, t in enumerate("abc")]
    engine = ScriptedEngine(outputs, between_steps=lease_lapses)
    # Left: a reaper requeues it.
    assert await runner(store, engine).run(job_id) is Ending.left
    assert engine.aborted == [job_id]
    assert [event["type"] for event in await stream(store, job_id)] == ["status", "status", "delta"]
    assert (await store.record(job_id)).status is JobState.running


async def test_choices_run_in_one_job_and_the_record_holds_the_first(store: JobStore) -> None:
    engine = ScriptedEngine(
        [
            EngineDelta(text="a", token_ids=[7]),
            EngineDelta(text="x", token_ids=[17], index=1, finished=True, finish_reason="stop"),
            EngineDelta(text="b", token_ids=[8], finished=True, finish_reason="length"),
        ]
    )
    job_id, events = await run(store, engine, n=2)
    assert [(event["type"], event.get("index")) for event in events[2:]] == [
        ("delta", None),  # choice 0's deltas stream as a job of one choice's do
        ("delta", 1),
        ("delta", None),
        ("done", None),
    ]
    assert (events[-1]["finish_reasons"], events[-1]["usage"]) == (
        ["length", "stop"],
        {"prompt_tokens": 3, "completion_tokens": 3},
    )
    record = await store.record(job_id)
    assert (record.status, record.output.text, record.output.token_count) == (JobState.completed, "ab", 2)


async def test_a_job_of_several_prompts_counts_every_prompt_and_ends_every_choice(store: JobStore) -> None:
    engine = ScriptedEngine([EngineDelta(text="a", token_ids=[7], finished=True, finish_reason="stop")])
    job_id, events = await run(store, engine, prompt=["hi", "there"])
    assert len(engine.prompts) == 2
    assert sorted(event.get("index") or 0 for event in events if event["type"] == "delta") == [0, 1]
    assert (events[-1]["type"], events[-1]["finish_reasons"], events[-1]["usage"]) == (
        "done",
        ["stop", "stop"],
        {"prompt_tokens": 6, "completion_tokens": 2},
    )


@pytest.mark.parametrize("request_fields", [{"n": 2}, {"prompt": ["hi", "there"]}])
async def test_a_job_of_several_choices_fails_rather_than_resumes(
    store: JobStore, request_fields: dict[str, object]
) -> None:
    job_id = await handed_back_after(store, [("a", 7)], **request_fields)
    engine = ScriptedEngine([EngineDelta(text="c", token_ids=[9], finished=True, finish_reason="stop")])
    assert await runner(store, engine).run(job_id) is Ending.ended
    assert engine.prompts == []
    events = await stream(store, job_id)
    assert (events[-1]["type"], events[-1]["code"]) == ("error", "not_resumable")
    assert (await store.record(job_id)).status is JobState.failed


async def test_a_job_whose_start_a_failover_lost_is_left_queued_for_another_run(store: JobStore) -> None:
    """The worker started the job on a master that a failover (or a partition) then replaced, and the
    new master never had the start: it holds the job queued, with no lease. Ending the run there
    would take a job still queued out of its queue, where no worker would ever find it."""
    job_id = (
        await store.submit(JobRequest(prompt="hi", stream_step=4), model="scripted", max_queued=0)
    ).job_id

    async def start_lost() -> None:  # what the new master holds of the job: its submission alone
        await store.redis.hset(store.keys.job(job_id), "status", JobState.queued.value)  # type: ignore[misc]
        await store.redis.delete(store.keys.lease(job_id))
        await store.redis.zadd(store.keys.model("scripted").queue, {job_id: 0})

    engine = ScriptedEngine(
        [
            EngineDelta(text="a", token_ids=[7]),
            EngineDelta(text="b", token_ids=[8], finished=True, finish_reason="length"),
        ],
        between_steps=start_lost,
    )
    assert await runner(store, engine).run(job_id) is Ending.left
    assert (await store.record(job_id)).status is JobState.queued
    assert await store.redis.zscore(store.keys.model("scripted").queue, job_id) is not None


async def test_a_run_longer_than_job_timeout_seconds_fails_with_timeout(
    store_factory: Callable[..., JobStore],
) -> None:
    """The runner times a run itself (arq's own time limit is not used): the job fails, saying why,
    with what it had produced."""
    store = store_factory(job_timeout_seconds=1)

    async def stall() -> None:
        await asyncio.sleep(3600)

    engine = ScriptedEngine(
        [EngineDelta(text="a", token_ids=[7]), EngineDelta(text="b", token_ids=[8])], between_steps=stall
    )
    job_id, events = await run(store, engine, stream_step=1)
    assert [event["type"] for event in events] == ["status", "status", "delta", "error"]
    assert (events[-1]["code"], events[-1]["message"]) == (
        "timeout",
        "the job ran longer than job_timeout_seconds",
    )
    record = await store.record(job_id)
    assert (record.status, record.output.text) == (JobState.failed, "a")
