"""The job runner against the real Redis, for engine faults the real engine cannot be made to show.

`ScriptedEngine` is a test double: it plays back a fixed list of engine outputs, so a test
can have the engine abort a request on its own or fail to render a prompt. Every normal
path runs on the real engine in tests/e2e.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from shared.events import event_adapter
from shared.jobstore import JobStore
from shared.requests import JobRequest
from worker.engine import EngineDelta, Prompt
from worker.jobs import JobRunner
from worker.publisher import Publisher


class ScriptedEngine:
    model_name = "scripted"
    max_model_len = 512

    def __init__(self, outputs: list[EngineDelta], render_error: Exception | None = None) -> None:
        self.outputs = outputs
        self.render_error = render_error
        self.aborted: list[str] = []

    def render(self, request: JobRequest) -> Prompt:
        if self.render_error is not None:
            raise self.render_error
        return Prompt(token_ids=[1, 2, 3], request=request)

    async def generate(self, request_id: str, prompt: Prompt) -> AsyncGenerator[EngineDelta, None]:
        for output in self.outputs:
            yield output

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def running_requests(self) -> int:
        return 0

    def shutdown(self) -> None:
        pass


async def run(
    store: JobStore, engine: ScriptedEngine, **request: object
) -> tuple[str, list[dict[str, object]]]:
    job_id = (await store.submit(JobRequest.model_validate({"prompt": "hi", **request}))).job_id
    await JobRunner(engine, store, Publisher(store.redis, store), "worker-1").run(job_id)
    entries = await store.redis.xrange(store.keys.stream(job_id))
    return job_id, [event_adapter.validate_json(fields["data"]).model_dump() for _, fields in entries]


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
