"""The lifecycle's typed wrappers against the real Redis: each transition answers an enum, and a job
out of attempts fails only with the output its stream holds when the failure is written."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from shared.errors import InvalidRequest, JobNotFound
from shared.events import (
    CancelledEvent,
    DeltaEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    JobState,
    StatusEvent,
    TokenLogprob,
    TopLogprob,
    Usage,
    event_adapter,
    event_json,
)
from shared.jobstore import JobStore, Outcome
from shared.keys import JobKeys
from shared.lifecycle import scripts
from shared.lifecycle.arguments import StepArgs
from shared.lifecycle.transitions import (
    CancelOutcome,
    Failure,
    Finished,
    FinishOutcome,
    JobStep,
    ReleaseOutcome,
    StepAnswer,
    Verdict,
)
from shared.requests import JobRequest
from tests.shared.transitions import MODEL, claimed, lose_last_entries, release, transitions

REQUEST = JobRequest(prompt="The capital of France is", max_tokens=8)
LEASE_SECONDS = 6.0


async def started(store: JobStore, worker_id: str = "worker-1") -> str:
    job_id = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
    assert await store.start(job_id, worker_id, MODEL, lease_seconds=LEASE_SECONDS) is not None
    return job_id


SCRIPTS = {
    "submit",
    "claim",
    "start",
    "step",
    "renew",
    "release",
    "finish",
    "cancel",
    "expire",
    "delete",
    "tenant_usage",
    "unclaim",
    "advertise",
    "batch_create",
    "batch_move",
    "cursor_check",
    # the streams' own Redis's part of each transition, when they have one
    "stream_open",
    "stream_take",
    "stream_end",
    "writer_mark",
    "writer_drop",
}
HELPERS = {
    "clock_ms",
    "share_member",
    "enqueue",
    "leave_queue",
    "hset_fields",
    "append_event",
    "announce_end",
    "tenant_admit",
    "tenant_move",
    "end_job",
    "end_unrun",
    "expire_unrun",
    "batch_end",
    "read_keys",
    "lease",
    "end_event",
    "prefix_holder",
    "job_keys",
}
FOLDER = Path(scripts.__file__).parent


def test_job_keys_lua_reads_a_jobs_keys_by_the_names_and_in_the_order_of_job_keys() -> None:
    source = (FOLDER / "job_keys.lua").read_text()
    unpacked = re.search(r"local (record[^=]*)= unpack\(KEYS, 1, JOB_KEYS\)", source)
    assert unpacked is not None
    names = [name.strip() for name in unpacked.group(1).split(",")]
    assert names == [field.name for field in fields(JobKeys)]
    assert f"local JOB_KEYS = {len(fields(JobKeys))}" in source


def test_every_script_ships_as_a_lua_file_and_gets_the_helpers_it_uses() -> None:
    assert {path.stem for path in FOLDER.glob("*.lua")} == SCRIPTS | HELPERS

    def calling(helper: str) -> set[str]:
        return {
            name for name in SCRIPTS if f"local function {helper}(" in getattr(scripts, name.upper()).source
        }

    # every script that touches a job reads its keys in one order (`JobKeys`), through one helper
    assert calling("job_keys") == {"submit", "start", "release", "finish", "cancel", "expire", "delete"}
    # the scripts that may end a job end it through one helper: its keys expire, its webhook hears
    # of it, its tenant's counters count it
    assert calling("end_job") == calling("batch_end") == {"start", "release", "finish", "cancel", "expire"}
    # and a batch's end is announced as a job's is
    assert calling("announce_end") == {"start", "release", "finish", "cancel", "expire", "batch_move"}
    assert calling("tenant_move") == {"start", "release", "finish", "cancel", "expire"}
    # submit alone checks the tenant's limits; the usage read counts running jobs as submit does
    assert calling("tenant_admit") == calling("tenant_running_jobs") == {"submit", "tenant_usage"}
    # the scripts that put a job on its model's queue, and those that take it out of its wait
    assert calling("enqueue") == {"submit", "release"}
    assert calling("leave_queue") == {"start", "cancel", "expire"}
    assert calling("end_unrun") == {"start", "cancel", "expire"}  # those that end a job that never ran
    assert calling("expire_unrun") == {"start", "expire"}  # one ending of a job past its deadline
    # one format of a share's member, for those that write it and the one that reads it
    assert calling("share_member") == {"submit", "start", "release", "cancel", "expire", "claim"}
    # every script that writes a job's stream writes it through the one helper that makes its ids
    assert calling("append_event") == {
        *("submit", "start", "step", "release", "finish", "cancel", "expire"),
        *("stream_open", "stream_take", "stream_end"),
    }
    # an end no worker makes keeps its terminal event in the record when the stream lives apart
    assert calling("end_event") == {"start", "release", "cancel", "finish", "expire"}
    # every script that reads who holds a lease reads it through one helper (a lease may carry a
    # cancel asked for after its holder)
    assert calling("lease_holder") == {
        *("start", "step", "renew", "release", "finish", "cancel", "unclaim"),
        *("stream_take", "stream_end", "writer_mark", "writer_drop"),
    }
    # the scripts that read a key of each of many jobs read them all in one command
    assert calling("get_keys") == {"step", "renew"}
    # a helper a helper uses comes with it, once, before it
    finish = scripts.FINISH.source
    assert finish.count("local function last_seq(") == 1
    assert finish.index("local function announce_end(") < finish.index("local function end_job(")


def test_every_lua_file_declares_the_helpers_it_calls() -> None:
    """Each file names every helper whose functions it calls on its own `-- uses:` line, not only
    through a helper that uses it (and one it does not name would be a nil global at run time)."""
    sources = {path.stem: path.read_text() for path in FOLDER.glob("*.lua")}
    defined = {name: set(re.findall(r"local function (\w+)\(", sources[name])) for name in HELPERS}
    for name, source in sources.items():
        for helper in HELPERS - {name, *scripts.uses(source)}:
            called = {function for function in defined[helper] if re.search(rf"\b{function}\(", source)}
            assert not called, f"{name}.lua calls {called} of {helper}.lua without naming it"


def test_the_step_reads_its_arguments_in_the_order_step_args_names_them() -> None:
    """The step alone takes positional ARGV (`shared.lifecycle.arguments`): both sides name them alike."""
    unpacked = re.search(r"local (.*) = unpack\(ARGV, 1, (\d+)\)", (FOLDER / "step.lua").read_text())
    assert unpacked is not None
    assert unpacked.group(1).split(", ") == list(StepArgs._fields)
    assert int(unpacked.group(2)) == len(StepArgs._fields)


EVENTS_AS_SENT = [
    (
        DeltaEvent(seq=7, text=' a "quote"\n\t\x01 é 漢 \U0001f600', token_ids=[1, 2]),
        '{"type":"delta","seq":7,"text":" a \\"quote\\"\\n\\t\\u0001 é 漢 \U0001f600",'
        '"token_ids":[1,2],"logprobs":null}',
    ),
    (
        DeltaEvent(
            seq=8,
            index=1,
            text="b",
            token_ids=[3],
            logprobs=[
                TokenLogprob(
                    token_id=3,
                    token="b",
                    logprob=-0.5,
                    rank=1,
                    top_logprobs=[TopLogprob(token_id=3, token="b", logprob=-0.5)],
                ),
                TokenLogprob(token_id=4, token="c", logprob=-1.25),
            ],
        ),
        '{"type":"delta","seq":8,"index":1,"text":"b","token_ids":[3],"logprobs":[{"token_id":3,"token":"b",'
        '"logprob":-0.5,"rank":1,"top_logprobs":[{"token_id":3,"token":"b","logprob":-0.5}]},'
        '{"token_id":4,"token":"c","logprob":-1.25,"top_logprobs":[]}]}',
    ),
    (
        StatusEvent(seq=2, state=JobState.running, message="resumed", resumed=True, attempt=2),
        '{"type":"status","seq":2,"state":"running","message":"resumed","resumed":true,"attempt":2}',
    ),
    (
        DoneEvent(
            seq=9,
            finish_reason="stop",
            stop_reasons=[None, 5],
            usage=Usage(prompt_tokens=3, completion_tokens=4),
        ),
        '{"type":"done","seq":9,"finish_reason":"stop","stop_reasons":[null,5],'
        '"usage":{"prompt_tokens":3,"completion_tokens":4}}',
    ),
    (
        CancelledEvent(seq=3, usage=Usage(prompt_tokens=1, completion_tokens=0)),
        '{"type":"cancelled","seq":3,"usage":{"prompt_tokens":1,"completion_tokens":0}}',
    ),
    (
        ErrorEvent(seq=4, message="boom", code="internal"),
        '{"type":"error","seq":4,"message":"boom","code":"internal"}',
    ),
]


@pytest.mark.parametrize(("event", "sent"), EVENTS_AS_SENT)
def test_an_event_goes_into_its_stream_as_pydantic_writes_its_json(event: Event, sent: str) -> None:
    assert event_json(event) == event.model_dump_json() == sent


def test_a_step_call_is_sent_byte_for_byte_as_step_lua_and_the_relay_read_it(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every job's lease, then its stream; the call's arguments, then each job's part and its events'
    (id, type, JSON); one notice a notice partition appended to, one line an event (`shared.notices`)."""
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000_123_456_789)
    (delta, delta_json), (status, status_json) = EVENTS_AS_SENT[0], EVENTS_AS_SENT[2]
    steps = [JobStep("job-a", [status, delta], check=True), JobStep("job-b", [])]
    command = transitions(store, maxlen=8).step_command(worker_id="worker-1", steps=steps)
    prefix, sha = store.keys.prefix, scripts.STEP.sha
    stream = f"{prefix}:job:job-a:events"
    lines = [f"{stream}\x1f2-1\x1fstatus\x1f1700000000123\x1f{status_json}"]
    lines.append(f"{stream}\x1f7-1\x1fdelta\x1f1700000000123\x1f{delta_json}")
    assert command == (
        "EVALSHA", sha, 4,
        f"{prefix}:job:job-a:lease", f"{prefix}:job:job-b:lease", stream, f"{prefix}:job:job-b:events",
        "worker-1", 8, 1700000000123, "PUBLISH", 1, store.keys.notices_of("job-a"), "\n".join(lines),
        "1", "", 2, "2-1", "status", status_json, "7-1", "delta", delta_json,
        "", "", 0,
    )  # fmt: skip


async def test_delete_takes_a_finished_jobs_keys_and_leaves_an_unfinished_one(store: JobStore) -> None:
    running = await started(store)
    with pytest.raises(InvalidRequest, match="cancel it first"):
        await store.delete(running)
    ended = (await store.submit(REQUEST, idempotency_key="delete-me", model=MODEL, max_queued=0)).job_id
    await store.cancel(ended)
    keys = [
        store.keys.job(ended),
        store.keys.stream(ended),
        store.keys.cancel(ended),
        store.keys.idempotency("delete-me"),
    ]
    await store.redis.set(store.keys.cancel(ended), "1", ex=60)  # every key a job may own, present
    assert await store.redis.exists(*keys) == len(keys)

    assert await store.delete(ended) is JobState.cancelled
    assert await store.redis.exists(*keys) == 0
    with pytest.raises(JobNotFound):
        await store.delete(ended)
    assert (await store.record(running)).status is JobState.running


async def test_cancel_answers_what_it_did_as_an_enum_with_the_state(store: JobStore) -> None:
    queued = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
    running = await started(store)

    async def cancel(job_id: str) -> tuple[CancelOutcome, JobState | None]:
        result = await transitions(store, maxlen=1000, retention_seconds=60, lifetime_seconds=60).cancel(
            job_id=job_id,
            model=MODEL,
            now=time.time(),
            cancelled=DeltaEvent(seq=1, text="", token_ids=[]),  # any event: only a queued job gets it
        )
        return result.outcome, result.state

    assert await cancel(queued) == (CancelOutcome.cancelled, JobState.cancelled)
    assert await cancel(queued) == (CancelOutcome.ended, JobState.cancelled)
    assert await cancel(running) == (CancelOutcome.asked, JobState.running)
    assert await release(store, running, attempt=1) is ReleaseOutcome.requeued
    assert await cancel(running) == (CancelOutcome.unheld, JobState.running)  # its output is to be read
    assert await cancel("no-such-job") == (CancelOutcome.missing, None)


def test_step_and_finish_answers_read_as_enums() -> None:
    assert StepAnswer.of("go") == StepAnswer(Verdict.go)
    assert StepAnswer.of(["cancel", "12.5"]) == StepAnswer(Verdict.cancel, 12.5)
    assert StepAnswer.of(["cancel", "not a time"]) == StepAnswer(Verdict.cancel)
    assert Finished.of(["lost"]) == Finished(FinishOutcome.lost)
    assert Finished.of(["not_running", "missing"]) == Finished(FinishOutcome.not_running)
    assert Finished.of(["ended", "completed"]) == Finished(FinishOutcome.ended, JobState.completed)


@pytest.mark.parametrize("stale", [False, True])
async def test_a_failure_read_from_an_older_stream_is_refused(store: JobStore, stale: bool) -> None:
    job_id = await started(store)
    await store.redis.hset(store.keys.job(job_id), "attempts", "3")  # type: ignore[misc]
    now = time.time()

    async def hand_back(failure: Failure | None) -> ReleaseOutcome:
        return await release(store, job_id, attempt=3, failure=failure, now=now)

    assert await hand_back(None) is ReleaseOutcome.exhausted
    assert not await store.redis.exists(store.keys.lease(job_id))  # nothing writes to the stream now
    assert await store.redis.sismember(store.keys.running, job_id)  # a reaper finds it if the caller goes
    entries = await store.redis.xrange(store.keys.stream(job_id))
    tip = "0-1" if stale else entries[-1][0]
    failure = Failure(ErrorEvent(seq=2, message="gone", code="worker_lost"), {}, tip)
    assert await hand_back(failure) is (ReleaseOutcome.exhausted if stale else ReleaseOutcome.failed)
    assert (await store.record(job_id)).status is (JobState.running if stale else JobState.failed)


async def test_a_claim_holds_a_job_for_its_worker_until_its_start(store: JobStore) -> None:
    """A claimed job stays queued, passed over by other workers' claims and refused to their starts,
    until its worker's start turns the claim into the run's lease; a start refused for a job that
    ended meanwhile lets go of the claim and of the job's queue entry."""
    submitted = {(await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id for _ in range(3)}
    queue = store.keys.model(MODEL).queue
    (first,) = await claimed(store, worker="worker-a")
    assert await store.redis.get(store.keys.lease(first)) == "claim:worker-a"
    (second,) = await claimed(store, worker="worker-b")
    assert second != first  # passed over

    assert await store.start(first, "worker-b", MODEL, lease_seconds=LEASE_SECONDS) is None
    assert (await store.record(first)).status is JobState.queued
    assert await store.redis.zscore(queue, first) is not None
    assert await store.start(first, "worker-a", MODEL, lease_seconds=LEASE_SECONDS) is not None
    assert await store.redis.get(store.keys.lease(first)) == "worker-a"
    assert await store.redis.zscore(queue, first) is None

    (third,) = await claimed(store, worker="worker-a")
    assert {first, second, third} == submitted
    await store.cancel(third)
    await store.redis.zadd(queue, {third: 0})  # a stale entry, as one whose job's keys expired
    assert await store.start(third, "worker-a", MODEL, lease_seconds=LEASE_SECONDS) is None
    assert await store.redis.exists(store.keys.lease(third)) == 0
    assert await store.redis.zscore(queue, third) is None
    await store.redis.delete(store.keys.lease(second))


async def step(
    store: JobStore, job_id: str, events: list[DeltaEvent], *, check: bool = False, maxlen: int = 1000
) -> Any:
    """The step script by EVALSHA, as the worker's pipeline sends it: loaded first, as the worker's
    publisher loads it (a fresh Redis has no scripts). `check`: as a step sent again, or the first of
    its job since a round trip failed."""
    await store.redis.script_load(scripts.STEP.source)
    command = transitions(store, maxlen=maxlen).step_command(
        worker_id="worker-1", steps=[JobStep(job_id, list(events), check)]
    )
    (answer,) = await store.redis.execute_command(*command)
    return answer


async def seqs(store: JobStore, job_id: str) -> list[int]:
    entries = await store.redis.xrange(store.keys.stream(job_id))
    return [event_adapter.validate_json(fields["data"]).seq for _, fields in entries]


async def test_steps_trim_a_stream_only_once_its_events_pass_the_cap(store: JobStore) -> None:
    """A step below the cap sends no MAXLEN (a stream holds at most its last seq + 1 events); past it,
    the stream is trimmed as XADD's `MAXLEN ~` trims: whole nodes of entries, never below the cap."""
    job_id = await started(store)  # its stream holds seqs 0 and 1
    cap = 150
    for seq in range(2, cap):
        assert await step(store, job_id, [DeltaEvent(seq=seq, text="a", token_ids=[1])], maxlen=cap) == "go"
    assert await seqs(store, job_id) == list(range(cap))
    for first in range(cap, 600, 2):
        events = [DeltaEvent(seq=seq, text="a", token_ids=[1]) for seq in (first, first + 1)]
        assert await step(store, job_id, events, maxlen=cap) == "go"
    kept = await seqs(store, job_id)
    assert kept[-1] == 599 and kept == list(range(kept[0], 600))
    assert cap <= len(kept) < 600 - 100  # a node of 100 entries or more went


async def test_a_step_sent_again_appends_only_what_the_stream_does_not_hold(store: JobStore) -> None:
    job_id = await started(store)
    first = [DeltaEvent(seq=2, text="a", token_ids=[1]), DeltaEvent(seq=3, text="b", token_ids=[2])]
    assert await step(store, job_id, first) == "go"
    # Its answer was lost on the way back: the worker sends it again, and nothing is added twice,
    # whether it reads the stream first or finds the ids taken.
    assert await step(store, job_id, first, check=True) == "go"
    assert await step(store, job_id, first) == "go"
    assert await seqs(store, job_id) == [0, 1, 2, 3]
    # The next step's first sending never reached Redis: sent again, it is appended.
    assert await step(store, job_id, [DeltaEvent(seq=4, text="c", token_ids=[3])], check=True) == "go"
    assert await seqs(store, job_id) == [0, 1, 2, 3, 4]


async def test_a_step_after_events_the_stream_lost_writes_nothing_and_says_what_the_stream_holds(
    store: JobStore,
) -> None:
    job_id = await started(store)
    assert await step(store, job_id, [DeltaEvent(seq=2, text="a", token_ids=[1])]) == "go"
    assert await step(store, job_id, [DeltaEvent(seq=3, text="b", token_ids=[2])]) == "go"
    await lose_last_entries(store, job_id, 1)  # a failover's new master had not received the last step
    next_step = [DeltaEvent(seq=4, text="c", token_ids=[3])]
    assert await step(store, job_id, next_step, check=True) == ["behind", 2]
    assert await seqs(store, job_id) == [0, 1, 2]
    # Written again with the lost event first, the step goes on with the ids the readers saw.
    lost_then_next = [DeltaEvent(seq=3, text="b", token_ids=[2]), DeltaEvent(seq=4, text="c", token_ids=[3])]
    assert await step(store, job_id, lost_then_next) == "go"
    entries = await store.redis.xrange(store.keys.stream(job_id))
    assert [entry_id for entry_id, _ in entries] == ["0-1", "1-1", "2-1", "3-1", "4-1"]


async def test_a_released_job_keeps_its_place_in_the_queue(store: JobStore) -> None:
    job_id = await started(store)
    created_at = (await store.record(job_id)).created_at.timestamp()
    later = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id
    now = time.time() + 60  # a hand-back long after the job was submitted
    assert await release(store, job_id, attempt=1, now=now) is ReleaseOutcome.requeued
    assert await store.redis.zscore(store.keys.model(MODEL).queue, job_id) == int(created_at * 1000)
    assert await store.redis.zrange(store.keys.model(MODEL).queue, 0, -1) == [job_id, later]


async def ttls(store: JobStore, job_id: str) -> list[int]:
    return [await store.redis.ttl(key) for key in (store.keys.job(job_id), store.keys.stream(job_id))]


async def test_start_and_renewals_give_a_running_jobs_keys_a_job_lifetime_again(
    store_factory: Callable[..., JobStore],
) -> None:
    store = store_factory(job_timeout_seconds=5)
    lifetime = store.settings.job_lifetime_seconds
    job_id = (await store.submit(REQUEST, model=MODEL, max_queued=0)).job_id

    async def near_their_end() -> None:  # as after a long wait in the queue, or a long run
        for key in (store.keys.job(job_id), store.keys.stream(job_id)):
            await store.redis.expire(key, 1)

    await near_their_end()
    assert await store.start(job_id, "worker-1", MODEL, lease_seconds=LEASE_SECONDS) is not None
    assert all(lifetime - 1 <= ttl <= lifetime for ttl in await ttls(store, job_id))
    for _ in range(3):  # heartbeats
        await near_their_end()
        lost = await store.renew("worker-1", [job_id], lease_seconds=LEASE_SECONDS, extend=[job_id])
        assert lost == []
        assert all(lifetime - 1 <= ttl <= lifetime for ttl in await ttls(store, job_id))
    # Another worker's renewal extends nothing of a job it does not hold.
    await near_their_end()
    lost = await store.renew("worker-2", [job_id], lease_seconds=LEASE_SECONDS, extend=[job_id])
    assert lost == [job_id]
    assert await ttls(store, job_id) == [1, 1]


async def expire_keys(store: JobStore, job_id: str) -> None:
    """A job's record and stream gone, as they go when they expire: together (the same scripts give
    them their TTL), the lease held all the same."""
    await store.redis.delete(store.keys.job(job_id), store.keys.stream(job_id))


@pytest.mark.parametrize("check", [False, True])
async def test_a_step_after_the_jobs_keys_expired_writes_nothing_and_stops_the_job(
    store: JobStore, check: bool
) -> None:
    """Whether the step reads its stream first or not: the stream is not made again (it would have no TTL)."""
    job_id = await started(store)
    await expire_keys(store, job_id)
    assert await step(store, job_id, [DeltaEvent(seq=2, text="a", token_ids=[1])], check=check) == "lost"
    assert not await store.redis.exists(store.keys.stream(job_id))
    assert await step(store, job_id, [DeltaEvent(seq=0, text="a", token_ids=[1])], check=check) == "lost"
    assert not await store.redis.exists(store.keys.stream(job_id))


async def test_one_step_call_answers_each_job_by_its_own_lease_and_stream(store: JobStore) -> None:
    """The call reads every job's lease at once (`step.lua`): each job is answered by its own lease
    and stream, and only the jobs answered 'go' or 'cancel' get their events."""
    held, taken, gone, cancelled = [await started(store) for _ in range(4)]
    await store.redis.set(store.keys.lease(taken), "worker-2")
    await expire_keys(store, gone)
    await store.cancel(cancelled)  # asked of its worker: its next step hears of it
    await store.redis.script_load(scripts.STEP.source)
    jobs = [held, taken, gone, cancelled]
    steps = [JobStep(job_id, [DeltaEvent(seq=2, text="a", token_ids=[1])]) for job_id in jobs]
    command = transitions(store, maxlen=1000).step_command(worker_id="worker-1", steps=steps)
    answers = [StepAnswer.of(answer) for answer in await store.redis.execute_command(*command)]
    assert [answer.verdict for answer in answers] == [Verdict.go, Verdict.lost, Verdict.lost, Verdict.cancel]
    assert answers[3].cancel_asked_at is not None
    assert [await seqs(store, job_id) for job_id in jobs] == [[0, 1, 2], [0, 1], [], [0, 1, 2]]
    assert not await store.redis.exists(store.keys.stream(gone))


async def renew(store: JobStore, job_id: str, worker_id: str = "worker-1") -> list[str]:
    return await store.renew(worker_id, [job_id], lease_seconds=LEASE_SECONDS, extend=[job_id])


async def test_a_cancel_asked_of_a_running_job_reaches_its_next_step_and_leaves_it_its_lease(
    store: JobStore,
) -> None:
    """The cancel rides on the lease (`lease.lua`): the step hears of it, when it was first asked for,
    and the lease keeps its holder and its TTL, so that the worker's renewals and end still work."""
    job_id = await started(store)
    lease = store.keys.lease(job_id)
    await store.redis.pexpire(lease, 4000)  # some way into the lease: a cancel must not renew it
    asked_at = time.time()
    assert (await store.cancel(job_id))[0].status is JobState.running
    assert 0 < await store.redis.pttl(lease) <= 4000  # not renewed (6 s), however late this reads it
    assert (await store.cancel(job_id))[0].status is JobState.running  # asked again: the first ask stands
    answer = StepAnswer.of(await step(store, job_id, [DeltaEvent(seq=2, text="a", token_ids=[1])]))
    assert answer.verdict is Verdict.cancel
    assert answer.cancel_asked_at is not None and asked_at <= answer.cancel_asked_at <= time.time()
    assert await seqs(store, job_id) == [0, 1, 2]  # the step's events go in first
    assert StepAnswer.of(await step(store, job_id, [])).verdict is Verdict.cancel  # and at every step after
    assert await renew(store, job_id, "worker-2") == [job_id]
    assert await renew(store, job_id) == []
    assert await store.redis.pttl(lease) > 4000
    usage = Usage(prompt_tokens=5, completion_tokens=1)
    outcome = Outcome(JobState.cancelled, "a", 1, usage)
    end = store.finish_commands(job_id, "worker-1", [CancelledEvent(seq=3, usage=usage)], outcome).record
    assert Finished.of(await store.redis.execute_command(*end)).outcome is FinishOutcome.ended
    assert not await store.redis.exists(lease)


async def test_a_worker_hands_back_a_job_whose_cancel_it_was_asked(store: JobStore) -> None:
    """Its release (by its holder) still works; the worker that resumes the job hears of the cancel
    at its first step, from the cancel key the start reads."""
    job_id = await started(store)
    await store.cancel(job_id)
    assert await release(store, job_id, attempt=1) is ReleaseOutcome.requeued
    assert await store.start(job_id, "worker-1", MODEL, lease_seconds=LEASE_SECONDS) is not None
    assert StepAnswer.of(await step(store, job_id, [])).verdict is Verdict.cancel


async def test_a_cancel_asked_while_a_job_is_handed_back_reaches_the_worker_that_resumes_it(
    store: JobStore,
) -> None:
    job_id = await started(store)
    assert await release(store, job_id, attempt=1) is ReleaseOutcome.requeued
    outcome = await transitions(store, maxlen=1000, retention_seconds=60, lifetime_seconds=600).cancel(
        job_id=job_id,
        model=MODEL,
        now=time.time(),
        cancelled=ErrorEvent(seq=2, message="cancelled", code="cancelled"),
    )
    assert outcome.outcome is CancelOutcome.unheld  # a worker resumes the job before its caller ends it
    assert await store.start(job_id, "worker-1", MODEL, lease_seconds=LEASE_SECONDS) is not None
    answer = StepAnswer.of(await step(store, job_id, [DeltaEvent(seq=3, text="a", token_ids=[1])]))
    assert answer.verdict is Verdict.cancel


async def test_a_scripts_named_table_carries_text_of_any_kind_as_it_was(store: JobStore) -> None:
    """A table travels as JSON (`shared.lifecycle.arguments`): text of any kind reaches Redis as it was."""
    request = JobRequest(prompt='Say "ça va?"\n\tthen 😀 and \\u0041 and \x00', max_tokens=8)
    job_id = (await store.submit(request, model=MODEL, max_queued=0, annotations={"note": "naïve 😀"})).job_id
    fields = await store.redis.hgetall(store.keys.job(job_id))  # type: ignore[misc]
    assert fields["request"] == request.model_dump_json(exclude_none=True)
    assert fields["annotation:note"] == "naïve 😀"
    created_at = float(fields["created_at"])
    assert repr(created_at) == fields["created_at"]  # written as it was sent, every digit
