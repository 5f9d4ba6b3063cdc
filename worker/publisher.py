"""The only writer of job streams: one Redis round trip per engine step, whatever the number of jobs.

Each running job hands its step (new events, plus the question "may I go on?") to the
publisher and waits. Steps that arrive while a round trip is in flight are gathered and
sent together in the next pipeline, like a group commit. The steps of a round trip are one
script call, which for each job checks its lease, appends its events and says whether the lease
carries a cancel asked for: a worker that lost a job's lease appends nothing to it.

A step that cannot be written (Redis unreachable, out of memory or read-only for a moment) is
sent again, with the same events, for as long as the job's lease could still be held: a stream's
ids are its events' seqs, and the step script appends only what the stream does not hold yet, so a
blip costs the job nothing. Only then does the job learn of the failure, and is handed back.

A failover can lose a job's last steps: Redis acknowledged them before its replica had them. The
new master's stream then ends before the step that follows, and the step script refuses it
(`behind`); the publisher writes the lost events again from the last `KEPT_EVENTS` it sent of the
job, with the ids and contents readers already saw, then the step. A job whose lost events it no
longer keeps is handed back, to resume from what the stream holds.

A job's end is acknowledged only once the replicas the store's `acks` asks for hold it: a round
trip that carries an end closes with a WAIT, in the same pipeline. An end short of its replicas
counts as not written, and is sent again like a step (ending a job is idempotent); should the master
die meanwhile, the sending that reaches the new master ends the job there, or the lease's lapse
hands the job on, as after a crash.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError

from shared.errors import BackendUnavailable
from shared.events import Event
from shared.jobstore import JobStore, Outcome
from shared.lifecycle import scripts
from shared.lifecycle.transitions import (
    FinishCommands,
    Finished,
    FinishOutcome,
    JobStep,
    StepAnswer,
    StepCall,
    Verdict,
)
from shared.redis_client import StreamsRedis, redis_errors
from shared.replication import ReplicaAcks, Wait

log = logging.getLogger(__name__)

GO = Verdict.go.value  # a step's answer at nearly every step, read without making an answer of it
RESEND_SECONDS = 0.1  # between sendings of steps that failed: a Redis restart takes about this long
KEPT_EVENTS = 64
"""A job's last events kept to write again after a failover lost them: a replica trails its master
by what the master wrote in the last few milliseconds, a step or two of each job."""
CHECK_AFTER_SECONDS = 1.0
"""A round trip this long after the last one reads every job's stream first: a failover takes longer
than this, and a worker whose steps paused through one may have reconnected without an error."""


EndCommand = Callable[[list[Event]], FinishCommands]
"""The EVALs that end a job with its last events, as pipeline commands (finish reads the stream
always, skips the events it holds, and leaves a job that ended alone)."""


@dataclass(slots=True)
class _Step:
    """One job's share of a round trip: its step (part of the round trip's one step call), or the
    EVAL that ends it."""

    job_id: str
    events: list[Event]
    answer: asyncio.Future[Any]
    end: EndCommand | None = None  # the job's end: acknowledged once replicas hold it
    check: bool = False  # read the stream at the first sending too (a sending again always does)
    failing_since: float | None = None  # monotonic time of the first failed sending

    def job_step(self) -> JobStep:
        return JobStep(self.job_id, self.events, self.check or self.failing_since is not None)


def _behind(answer: Any) -> int | None:
    """The seq of the stream's last event when a step's or an end's answer is ['behind', that seq]."""
    if isinstance(answer, list) and answer and answer[0] == Verdict.behind.value:
        return int(answer[1])
    return None


def _step_answers(calls: list[StepCall], answers: list[Any], steps: int) -> list[Any]:
    """Each step's answer, in the round trip's order, from its call's list (or the error the call met)."""
    if len(calls) == 1 and calls[0].positions is None:  # one call for all, in their order: nearly always
        (answer,) = answers
        return [answer] * steps if isinstance(answer, Exception) else list(answer)
    each: list[Any] = [None] * steps
    for call, answer in zip(calls, answers, strict=True):
        positions = call.positions if call.positions is not None else range(steps)
        for at, position in enumerate(positions):
            each[position] = answer if isinstance(answer, Exception) else answer[at]
    return each


def _ended(answer: Any) -> bool:
    """Whether an end's answer from the streams' Redis is that the stream ended (`stream_end.lua`)."""
    return isinstance(answer, list) and answer[:1] == [FinishOutcome.ended.value]


def _as_sent(result: Any) -> Any:
    """A command's answer, with a Redis error named as the Redis boundary names it (an unavailable
    Redis is `BackendUnavailable` whether the round trip or the one command met it). NOSCRIPT stays
    itself: it only means the step script must be loaded again (Redis restarted or was flushed)."""
    if not isinstance(result, Exception) or isinstance(result, NoScriptError):
        return result
    try:
        with redis_errors():
            raise result
    except Exception as exc:  # classified, then handed on as it was or as named
        return exc


class Publisher:
    """Sends the steps and ends of a worker's jobs, gathered into one pipeline per round trip."""

    def __init__(
        self, redis: StreamsRedis, store: JobStore, worker_id: str, resend_seconds: float = 0.0
    ) -> None:
        self.redis = redis
        self.store = store
        self.worker_id = worker_id
        self.resend_seconds = resend_seconds
        """How long a step that cannot be written is sent again: a worker's lease, after which
        another worker may hold the job."""
        self._pending: list[_Step] = []
        self._sender: asyncio.Task[None] | None = None
        self.round_trips = 0
        self._failing = False  # the last round trip met an unavailable Redis (said once per outage)
        self.cancels_asked_at: dict[str, float] = {}
        """When the cancel a job's step saw was asked for (epoch seconds), until the job takes it."""
        self._sent: dict[str, deque[Event]] = {}
        """Each running job's last `KEPT_EVENTS` events sent, until `forget`."""
        self._unchecked: set[str] = set()
        """Jobs whose next step reads its stream first: a round trip failed since their last step, or
        none was made for `CHECK_AFTER_SECONDS` (a failover may have lost the steps before it). Any
        other step's stream is not read."""
        self._last_round_trip = time.monotonic()

    async def step(self, job_id: str, events: list[Event]) -> Verdict:
        """Append `events` to the job's stream if this worker still holds the job; may it go on?"""
        answer = await self._write(job_id, events, None)
        verdict = Verdict.go if answer == GO else self._verdict(job_id, answer)
        if verdict is Verdict.go or verdict is Verdict.cancel:
            kept = self._sent.get(job_id)
            if kept is None:
                kept = self._sent[job_id] = deque(maxlen=KEPT_EVENTS)
            kept.extend(events)
        return verdict

    def _verdict(self, job_id: str, answer: Any) -> Verdict:
        """The verdict of a step's answer other than `go`, noting when a cancel it met was asked for."""
        read = StepAnswer.of(answer)
        if read.cancel_asked_at is not None:
            self.cancels_asked_at[job_id] = read.cancel_asked_at
        return read.verdict

    async def finish(self, job_id: str, events: list[Event], outcome: Outcome) -> Finished:
        """Append the last events, the terminal one last, and end the job, if this worker still holds it."""

        def end(events: list[Event]) -> FinishCommands:
            return self.store.finish_commands(job_id, self.worker_id, events, outcome)

        return Finished.of(await self._write(job_id, events, end))

    def forget(self, job_id: str) -> None:
        """The job's run here is over: its events need not be kept any more."""
        self._sent.pop(job_id, None)
        self._unchecked.discard(job_id)

    async def _write(self, job_id: str, events: list[Event], end: EndCommand | None) -> Any:
        """The answer to the job's step, or to `end`; when it finds the stream `behind`, the lost
        events this publisher keeps are sent again before `events`, once."""
        if time.monotonic() - self._last_round_trip > CHECK_AFTER_SECONDS:
            self._unchecked.update(self._sent)
        answer = await self._submit(job_id, events, end, job_id in self._unchecked)
        self._unchecked.discard(job_id)
        last_seq = _behind(answer)
        lost = [] if last_seq is None or not events else self._lost(job_id, last_seq, events[0].seq)
        if lost:
            log.warning("a failover lost events %d to %d; writing them again", lost[0].seq, lost[-1].seq)
            answer = await self._submit(job_id, [*lost, *events], end, check=True)
        return answer

    def _lost(self, job_id: str, last_seq: int, next_seq: int) -> list[Event]:
        """The kept events after `last_seq` and before `next_seq`; none unless they are all kept."""
        lost = [event for event in self._sent.get(job_id, ()) if last_seq < event.seq < next_seq]
        return lost if lost and lost[0].seq == last_seq + 1 and lost[-1].seq == next_seq - 1 else []

    def _submit(
        self, job_id: str, events: list[Event], end: EndCommand | None, check: bool
    ) -> asyncio.Future[Any]:
        """The step's answer to come (a future, not a coroutine: one object less a step)."""
        sender = self._sender
        if sender is None or sender.done():
            sender = self._sender = asyncio.create_task(self._send_pending())
        # The sender's loop is the running one: asking asyncio for it costs a system call (getpid).
        answer = sender.get_loop().create_future()
        self._pending.append(_Step(job_id, events, answer, end, check))
        return answer

    async def _send_pending(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            results = await self._round_trip(batch)
            unloaded, again = [], []
            for step, result in zip(batch, results, strict=True):
                if step.answer.done():  # its job stopped waiting (cancelled)
                    continue
                if not isinstance(result, Exception):  # nearly every step's
                    step.answer.set_result(result)
                elif isinstance(result, NoScriptError):
                    unloaded.append(step)
                elif isinstance(result, BackendUnavailable) and self._may_resend(step):
                    again.append(step)
                else:
                    step.answer.set_exception(result)
            if unloaded:  # Redis restarted (or flushed its scripts): load the step script, send them again
                await self._load_step_script(unloaded)
            if again:
                await asyncio.sleep(RESEND_SECONDS)
                self._pending[:0] = again

    async def _round_trip(self, batch: list[_Step]) -> list[Any]:
        """One pipeline of the batch: every step in one script call, each end in one of its own:
        each one's answer, or the error it met, in the batch's order."""
        steps = [step for step in batch if step.end is None]
        ends = [(step, step.end) for step in batch if step.end is not None]
        try:
            step_answers, end_answers = await self._send(steps, [end(step.events) for step, end in ends])
        except Exception as exc:  # the round trip itself failed: every waiting job meets it
            error = _as_sent(exc)
            step_answers, end_answers = [error] * len(steps), [error] * len(ends)
        if ends:
            answers = iter(step_answers), iter(end_answers)
            results = [next(answers[step.end is not None]) for step in batch]
        else:  # nearly every round trip: steps only
            results = step_answers
        self.round_trips += 1
        self._last_round_trip = time.monotonic()
        failed = next((result for result in results if isinstance(result, BackendUnavailable)), None)
        if failed is not None and not self._failing:
            log.warning("steps could not be written (%s); sending them again", failed.message)
        elif failed is None and self._failing:
            log.info("steps are written again")
        self._failing = failed is not None
        if failed is not None:
            # A failover may have lost what went before: the next step of every job reads its stream
            # first, the steps already waiting for the next round trip too (they were handed over
            # before this failure was known, and the next round trip may reach a new master at once).
            self._unchecked.update(self._sent)
            for waiting in self._pending:
                waiting.check = True
        return results

    async def _send(self, steps: list[_Step], ends: list[FinishCommands]) -> tuple[list[Any], list[Any]]:
        """The answers to `steps`, one a step, and to the `ends`, which count as written only once the
        replicas the store's `acks` asks for hold them (a WAIT closes the pipeline). An end goes in the
        steps' round trip (`FinishCommands.first`); with the streams apart that ends the stream, and
        the record's end follows in one more round trip (`then`)."""
        store = self.store
        first = [end.first for end in ends]
        step_answers, end_answers = await self._pipeline(self.redis, store.stream_acks, steps, first)
        ended = [at for at, answer in enumerate(end_answers) if ends[at].then is not None and _ended(answer)]
        if ended:
            store.planes.between("finish")
            _, records = await self._pipeline(store.redis, store.acks, [], [ends[at].record for at in ended])
            for at, answer in zip(ended, records, strict=True):
                end_answers[at] = answer
        return step_answers, end_answers

    async def _pipeline(
        self, redis: StreamsRedis, acks: ReplicaAcks | None, steps: list[_Step], ends: list[tuple[Any, ...]]
    ) -> tuple[list[Any], list[Any]]:
        """`_send`'s round trip to one Redis, whose replicas `acks` counts (None: no WAIT)."""
        pipe = redis.pipeline(transaction=False)
        calls: list[StepCall] = []
        if steps:
            jobs = [step.job_step() for step in steps]
            calls = self.store.step_calls(self.worker_id, jobs)
            for call in calls:
                pipe.execute_command(*call.command)
        for command in ends:
            pipe.execute_command(*command)
        wait = await acks.wait() if ends and acks is not None else None
        for command in wait.commands if wait is not None else ():
            pipe.execute_command(*command)
        sent = [_as_sent(result) for result in await pipe.execute(raise_on_error=False)]
        step_answers = _step_answers(calls, sent[: len(calls)], len(steps))
        sent = sent[len(calls) :]
        end_answers = sent[: len(ends)]
        if wait is not None:
            fenced, acked = sent[len(ends) :]
            acked = None if isinstance(fenced, Exception) or not isinstance(acked, int) else acked
            assert acks is not None
            end_answers = [self._acknowledged(acks, answer, wait, acked) for answer in end_answers]
        return step_answers, end_answers

    def _acknowledged(self, acks: ReplicaAcks, result: Any, wait: Wait, acked: int | None) -> Any:
        """An end's answer, or `BackendUnavailable` when fewer replicas than `wait` asks for hold it."""
        if isinstance(result, Exception):
            return result
        try:
            acks.check(wait, acked, "a job's end")
        except BackendUnavailable as exc:
            return exc
        return result

    def _may_resend(self, step: _Step) -> bool:
        """Whether a step that could not be written is to be sent again: while its lease could hold."""
        now = time.monotonic()
        if step.failing_since is None:
            step.failing_since = now
        return now - step.failing_since < self.resend_seconds

    async def _load_step_script(self, steps: list[_Step]) -> None:
        try:
            with redis_errors():
                await self.redis.script_load(scripts.STEP.source)
        except Exception as exc:
            for step in steps:
                step.answer.set_exception(exc)
            return
        self._pending[:0] = steps
