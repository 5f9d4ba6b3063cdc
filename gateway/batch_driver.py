"""The batch driver: one per gateway process, a background task of the lifespan, that takes the
active batches whose lease is free and drives each to its end.

A batch is driven by one gateway at a time, under a lease (`Keys.batch_lease`) it renews while it
lives; whatever it does is written to the batch's record as it goes, so that the gateway that takes
the lease after a crash goes on from there:

- validating: the input file is copied for the batch (`input_copy`: the batch reads its own copy to its
  end, whatever becomes of the file), then every line is read once and checked (`lines`), with nothing
  submitted; a line that is no request of the batch fails the batch with `errors`, else it is
  `in_progress` with its total.
- in_progress: the lines are submitted as jobs in order, as the batch's room (`batch_in_flight` jobs
  queued or running) and its tenant's limits allow, each under the job id its line's number gives
  (`shared.batches.line_job_id`): a line submitted again after a takeover finds its job. The record
  keeps how many lines are done and where the next begins in the input (`fed`, `fed_offset`), so a
  takeover reads on from there. A line admission refuses gets its error file entry (`Keys.batch_refusals`).
  A line's job that ends has its keys kept until the window's end and a retention after it (`_keep_ended`),
  however long the batch runs; once the files are written they expire after the retention as any job's.
- once every line is done and every job ended: `finalizing`, and the output and error files are written
  in input order, under ids the batch's own gives them, each whole or not at all (a takeover writes them
  again), before the batch ends `completed` in the same step as its files are named, with the request
  counts the files hold: a line whose result was lost all the same (every gateway down past the
  retention) is in the error file as `batch_result_expired`, never missing or counted completed.
- a cancel (`cancelling`) or the window's end stops the feeding, cancels the jobs still queued or
  running, waits for them to end, and writes the files of what finished: `cancelled` or `expired`.
- a batch whose own copy of its input is gone (its storage lost it) cancels its jobs and fails with
  `input_lost`; a run that fails otherwise is taken up again after a rest that doubles up to a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gateway.admission import Admission
from gateway.batches.lines import BatchLine, LineRefused, batch_line
from gateway.batches.store import MAX_ERRORS, Batches, Progress
from gateway.compat.openai_answers import Answer
from gateway.compat.openai_bodies import ChatBody, CompletionBody
from gateway.compat.pooling import EmbeddingsBody
from gateway.compat.responses_answers import Head, Standing, response_object
from gateway.files.jsonl import Line
from gateway.files.store import Files
from gateway.generation import Collected, raise_for_failure, whole_answer
from shared.batches import FILE_ID_PREFIX, BatchError, BatchLineJob, line_job_id, output_line, unrun_line
from shared.config import GatewaySettings
from shared.errors import BackendUnavailable, Overloaded, RateLimited, StreampoolError
from shared.events import JobState, event_adapter
from shared.jobstore import JobStore
from shared.redis_client import redis_errors

log = logging.getLogger(__name__)

TICK_SECONDS = 0.2  # how often a driver looks for batches, and a batch for room
FEED_GROUP = 64  # lines submitted between two writes of the batch's progress
READ_GROUP = 64  # lines whose jobs are read in one round trip while the files are written
KEEP_GROUP = 512  # ended jobs whose keys are kept in one round trip
REST_SECONDS = (1.0, 60.0)  # a batch whose run failed rests this long before it is taken up again, doubling
UNRUN = {
    "cancelled": ("batch_cancelled", "The batch was cancelled before this request completed."),
    "expired": ("batch_expired", "This request could not be executed before the completion window expired."),
}
LOST = (
    "batch_result_expired",
    "This request ran, but its result expired before the batch's output was written (no gateway drove "
    "the batch for longer than the retention).",
)
Failure = Callable[[StreampoolError], tuple[int, dict[str, Any]]]
"""How a refused or failed request answers: status and body in OpenAI's error shape."""


def derived_file_id(batch_id: str, kind: str) -> str:
    """The id of a batch's output or error file: the same whichever gateway writes it, however often."""
    return FILE_ID_PREFIX + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:32]


class BatchDriver:
    """Takes up active batches whose lease is free, each in a task of its own."""

    def __init__(
        self,
        settings: GatewaySettings,
        batches: Batches,
        files: Files,
        admission: Admission,
        store: JobStore,
        failure: Failure,
    ) -> None:
        self.settings = settings
        self.batches = batches
        self.files = files
        self.admission = admission
        self.store = store
        self.failure = failure
        self.holder = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._runs: dict[str, asyncio.Task[None]] = {}
        self._rests: dict[str, tuple[float, float]] = {}  # batch id -> (its last rest, resting until)

    async def run(self) -> None:
        """Until cancelled; Redis failures pause it, never end it."""
        lease = self.settings.batch_lease_seconds
        while True:
            try:
                now, active = time.monotonic(), await self.batches.active()
                self._rests = {batch_id: rest for batch_id, rest in self._rests.items() if batch_id in active}
                for batch_id in active:
                    if batch_id in self._runs or self._rests.get(batch_id, (0, 0))[1] > now:
                        continue
                    if await self.batches.take(batch_id, self.holder, lease):
                        self._runs[batch_id] = asyncio.create_task(self._drive(batch_id), name=batch_id)
            except BackendUnavailable as exc:
                log.warning("batches: %s", exc.message)
            except Exception:  # a fault here must not end every later batch of this gateway
                log.exception("batches: the driver failed; it goes on")
            await asyncio.sleep(TICK_SECONDS)

    async def close(self) -> None:
        """Stop driving (the leases lapse, and another gateway goes on with the batches)."""
        for task in self._runs.values():
            task.cancel()
        await asyncio.gather(*self._runs.values(), return_exceptions=True)

    async def _drive(self, batch_id: str) -> None:
        driving = asyncio.current_task()
        assert driving is not None
        keeper = asyncio.create_task(self._keep(batch_id, driving))
        try:
            await BatchRun(self, batch_id).drive()
            self._rests.pop(batch_id, None)
        except asyncio.CancelledError:
            raise
        except BackendUnavailable as exc:
            log.warning(
                "batch %s: %s; it is taken up again in %.0f s", batch_id, exc.message, self._rest(batch_id)
            )
        except Exception:
            log.exception(
                "batch %s: its run failed; it is taken up again in %.0f s", batch_id, self._rest(batch_id)
            )
        finally:
            keeper.cancel()
            self._runs.pop(batch_id, None)
            with contextlib.suppress(StreampoolError):
                await self.batches.let_go(batch_id, self.holder)

    def _rest(self, batch_id: str) -> float:
        """Rest the batch after a failed run, twice as long as after the last one (a fault that stays,
        such as a bug its input meets, costs a traceback a minute, not five a second)."""
        last = self._rests.get(batch_id, (REST_SECONDS[0] / 2, 0.0))[0]
        rest = min(last * 2, REST_SECONDS[1])
        self._rests[batch_id] = (rest, time.monotonic() + rest)
        return rest

    async def _keep(self, batch_id: str, driving: asyncio.Task[None]) -> None:
        """Renew the lease a third of its time; once it is another's (this gateway stalled past it),
        stop driving: that gateway goes on."""
        lease = self.settings.batch_lease_seconds
        while True:
            await asyncio.sleep(lease / 3)
            try:
                kept = await self.batches.keep(batch_id, self.holder, lease)
            except BackendUnavailable:
                continue
            if not kept:
                driving.cancel()
                return


class BatchRun:
    """One gateway's drive of one batch, from where its record says it is."""

    def __init__(self, driver: BatchDriver, batch_id: str) -> None:
        self.driver = driver
        self.batch_id = batch_id
        self.settings = driver.settings
        self.batches = driver.batches
        self._lines: AsyncIterator[Line] | None = None
        self._next: Line | None = None  # read, and not yet submitted (its tenant was at a limit)

    async def drive(self) -> None:
        try:
            await self._drive()
        except FileNotFoundError:
            await self._input_lost()

    async def _drive(self) -> None:
        while True:
            record = await self.batches.record(self.batch_id)
            status, self.endpoint = record["status"], record["endpoint"]
            self.owner, self.input_file_id = record["owner"], record["input_file_id"]
            self.input = record.get("input_copy") or self.input_file_id  # a batch validated before copies
            self.expires_at = int(record["expires_at"])
            ending = record.get("ending") or None
            if status == "validating":
                await self._validate()
                continue
            if status == "cancelling":
                ending = "cancelled"
            elif status == "in_progress" and ending is None and time.time() >= int(record["expires_at"]):
                ending = "expired"
                await self.batches.move(self.batch_id, ("in_progress",), "in_progress", ending=ending)
            if status in ("in_progress", "cancelling") and ending is not None:
                await self._stop(ending, status)
                return
            if status == "finalizing":
                await self._finish("completed", status)
                return
            if status != "in_progress":
                return  # ended
            await self._keep_ended()
            if not await self._feed(await self.batches.progress(self.batch_id)):
                await asyncio.sleep(TICK_SECONDS)

    async def _validate(self) -> None:
        """Copy the input for the batch and read every line once; fail the batch with what is wrong, or
        set it going."""
        errors: list[BatchError] = []
        seen: set[bytes] = set()
        models: dict[str, str | None] = {}  # model -> why it is refused (None: it is served)
        total = 0
        storage, copy = self.driver.files.storage, derived_file_id(self.batch_id, "input")
        try:
            chunks = storage.read(self.input_file_id)
            await storage.write(copy, _joined(await anext(chunks, b""), chunks))
            async for line in self.driver.files.lines(copy, self.settings.max_body_bytes):
                total += 1
                try:
                    request = batch_line(line, self.endpoint)
                    await self._check_request(request, seen, models)
                except LineRefused as refused:
                    if len(errors) < MAX_ERRORS:
                        errors.append(refused.error)
        except FileNotFoundError:
            errors.append(
                BatchError(code="invalid_file", message=f"the input file {self.input_file_id} is gone")
            )
        if total == 0 and not errors:
            errors.append(BatchError(code="empty_file", message="the input file holds no request"))
        if errors:
            data = json.dumps([error.model_dump(exclude_none=True) for error in errors])
            await self.batches.move(
                self.batch_id, ("validating",), "failed", failed_at=int(time.time()), errors=data
            )
            await storage.delete(copy)
            return
        await self.batches.move(
            self.batch_id,
            ("validating",),
            "in_progress",
            in_progress_at=int(time.time()),
            total=total,
            input_copy=copy,
        )

    async def _check_request(
        self, request: BatchLine, seen: set[bytes], models: dict[str, str | None]
    ) -> None:
        """`LineRefused` for a custom_id seen before, or a model no worker serves or will."""
        digest = hashlib.blake2b(request.custom_id.encode(), digest_size=12).digest()
        if digest in seen:
            message = f"custom_id {request.custom_id!r} is used by an earlier line"
            raise LineRefused(
                BatchError(
                    code="duplicate_custom_id", message=message, param="custom_id", line=request.number
                )
            )
        seen.add(digest)
        if request.model not in models:
            try:
                await self.driver.admission.resolve(request.model)
                models[request.model] = None
            except StreampoolError as exc:
                if isinstance(exc, BackendUnavailable):
                    raise
                models[request.model] = exc.message
        if (why := models[request.model]) is not None:
            raise LineRefused(
                BatchError(code="model_not_found", message=why, param="body.model", line=request.number)
            )

    async def _feed(self, progress: Progress) -> bool:
        """Submit the next lines the batch's room takes; answers whether anything moved."""
        if progress.fed >= progress.total:
            if progress.in_flight > 0:
                return False
            moved = await self.batches.move(
                self.batch_id, ("in_progress",), "finalizing", finalizing_at=int(time.time())
            )
            return moved
        room = min(self.settings.batch_in_flight - progress.in_flight, FEED_GROUP)
        if room <= 0:
            return False
        if self._lines is None:
            self._lines = self.driver.files.lines(
                self.input, self.settings.max_body_bytes, progress.fed_offset, progress.fed + 1
            ).__aiter__()
        fed, offset = progress.fed, progress.fed_offset
        for _ in range(room):
            line = self._next or await anext(self._lines, None)
            if line is None:
                break
            self._next = line
            if not await self._submit(line):
                break  # its tenant is at a limit, or the queue is full: this line again, later
            self._next = None
            fed, offset = line.number, line.end
        if fed == progress.fed:
            return False
        await self.batches.advance(self.batch_id, fed, offset)
        return True

    async def _submit(self, line: Line) -> bool:
        """Submit the line's job; False when admission says "later" (nothing was written)."""
        request = batch_line(line, self.endpoint)  # validated: it is a request
        try:
            body = request.request(self.endpoint)
            if isinstance(body, EmbeddingsBody):
                job, fill, annotations = body.job_request(), False, None
            elif isinstance(body, ChatBody | CompletionBody):
                job = body.job_request(self.settings.max_tokens_limit)
                fill, annotations = body.fills_context, None
            else:
                job = body.job_request(self.settings.max_tokens_limit)
                fill, annotations = body.max_output_tokens is None, body.stored(job).annotations()
            await self.driver.admission.admit(
                job,
                self.owner,
                model=body.model,
                annotations=annotations,
                fill_context=fill,
                batch_line=BatchLineJob(self.batch_id, line.number, self.expires_at),
            )
        except (RateLimited, Overloaded) as exc:
            log.info("batch %s: line %d waits: %s", self.batch_id, line.number, exc.message)
            await asyncio.sleep(min(getattr(exc, "retry_after", 1), 1))
            return False
        except BackendUnavailable:
            raise
        except StreampoolError as exc:
            await self.batches.refuse(self.batch_id, line.number, *self.driver.failure(exc))
        return True

    async def _stop(self, ending: str, status: str) -> None:
        """A cancel or the window's end: no more lines; the jobs still queued or running are cancelled,
        and once they have all ended the files are written."""
        await self._cancel_jobs()
        await self._finish(ending, status)

    async def _cancel_jobs(self) -> None:
        """Cancel the batch's jobs still queued or running, and wait until they have all ended."""
        progress = await self.batches.progress(self.batch_id)
        store = self.driver.store
        for job_ids in self._job_groups(progress.fed, READ_GROUP):
            async with store.redis.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.hget(store.keys.job(job_id), "status")
                states = await pipe.execute()
            for job_id, state in zip(job_ids, states, strict=True):
                if state in (JobState.queued.value, JobState.running.value):
                    await store.cancel(job_id)
        while (await self.batches.progress(self.batch_id)).in_flight > 0:
            await self._keep_ended()
            await asyncio.sleep(TICK_SECONDS)

    def _job_groups(self, fed: int, size: int) -> Iterator[list[str]]:
        """The job ids of the batch's first `fed` lines, `size` at a time."""
        for first in range(1, fed + 1, size):
            yield [line_job_id(self.batch_id, n) for n in range(first, min(first + size, fed + 1))]

    async def _keep_ended(self) -> None:
        """Keep the keys of the batch's jobs that ended since the last call until its files can be
        written: until the window's end and a retention after it (`Keys.batch_ended`)."""
        store = self.driver.store
        ended = store.keys.batch_ended(self.batch_id)
        until = self.expires_at + self.settings.retention_seconds
        with redis_errors():
            while job_ids := await store.redis.lrange(ended, 0, KEEP_GROUP - 1):  # type: ignore[misc]
                await self._expire(job_ids, until=until)
                await store.redis.ltrim(ended, len(job_ids), -1)  # type: ignore[misc]
                if len(job_ids) < KEEP_GROUP:
                    return

    async def _expire(self, job_ids: list[str], *, until: int | None = None, after: int = 0) -> None:
        """Have the jobs' records and streams expire at `until` at the earliest, or else `after` seconds
        from now at the latest."""
        store = self.driver.store
        keys = store.keys
        for client, key_of in ((store.redis, keys.job), (store.streams, keys.stream)):
            async with client.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    if until is not None:
                        pipe.expireat(key_of(job_id), until, gt=True)
                    else:
                        pipe.expire(key_of(job_id), after, lt=True)
                await pipe.execute()

    async def _input_lost(self) -> None:
        """The batch's own copy of its input is gone (its storage lost it): nothing more can be read or
        written of its lines, so its jobs are cancelled and it fails saying so."""
        log.error("batch %s: its input %s is gone; the batch fails", self.batch_id, self.input)
        await self._cancel_jobs()
        error = BatchError(
            code="input_lost", message=f"the batch's input (file {self.input_file_id}) is gone"
        )
        await self.batches.move(
            self.batch_id,
            ("in_progress", "cancelling", "finalizing"),
            "failed",
            failed_at=int(time.time()),
            errors=json.dumps([error.model_dump(exclude_none=True)]),
        )

    async def _finish(self, ending: str, status: str) -> None:
        """Write the output and error files (those that have a line), then end the batch naming them, with
        the request counts they hold; then its jobs' keys expire after the retention, and its copy goes."""
        progress = await self.batches.progress(self.batch_id)
        await self._keep_ended()
        unrun = progress.total - progress.fed
        named: dict[str, str] = {}
        tally = Tally()
        for kind in ("output", "error"):
            chunks = self._file(kind == "output", ending, progress.fed, tally).__aiter__()
            if (first := await anext(chunks, None)) is None:
                continue
            file_id = derived_file_id(self.batch_id, kind)
            await self.driver.files.create(
                file_id,
                self.owner,
                functools.partial(str, f"{self.batch_id}_{kind}.jsonl"),
                "batch_output",
                _joined(first, chunks),
            )
            named[f"{kind}_file_id"] = file_id
        if tally.lost:
            log.warning(
                "batch %s: %d lines' results expired before its files were written", self.batch_id, tally.lost
            )
        ended = await self.batches.move(
            self.batch_id,
            (status,),
            ending,
            unrun=unrun,
            completed=tally.completed,
            failed=tally.lines - tally.completed - progress.refused - unrun,
            **named,
            **{f"{ending}_at": int(time.time())},
        )
        if not ended:  # a cancel came meanwhile: the next drive ends it, from the same lines and copy
            return
        for job_ids in self._job_groups(progress.fed, KEEP_GROUP):
            await self._expire(job_ids, after=self.settings.retention_seconds)
        await self.driver.files.storage.delete(derived_file_id(self.batch_id, "input"))

    async def _file(self, successes: bool, ending: str, fed: int, tally: Tally) -> AsyncIterator[bytes]:
        """The output file's lines (`successes`) or the error file's, in input order, a group at a time
        (none empty); the output file's pass counts the lines in `tally`."""
        group: list[Line] = []
        async for line in self.driver.files.lines(self.input, self.settings.max_body_bytes):
            group.append(line)
            if len(group) == READ_GROUP:
                if chunk := await self._render(group, successes, ending, fed, tally):
                    yield chunk
                group = []
        if group and (chunk := await self._render(group, successes, ending, fed, tally)):
            yield chunk

    async def _render(self, lines: list[Line], successes: bool, ending: str, fed: int, tally: Tally) -> bytes:
        store = self.driver.store
        keys = store.keys
        requests = [batch_line(line, self.endpoint) for line in lines]
        job_ids = [line_job_id(self.batch_id, request.number) for request in requests]
        async with store.redis.pipeline(transaction=False) as pipe:
            for request, job_id in zip(requests, job_ids, strict=True):
                pipe.hget(keys.batch_refusals(self.batch_id), str(request.number))
                pipe.hmget(keys.job(job_id), ["status", "created_at"])
            answers = await pipe.execute()
        async with store.streams.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.xrange(keys.stream(job_id))
            streams = await pipe.execute()
        rendered: list[dict[str, Any]] = []
        for index, (request, job_id) in enumerate(zip(requests, job_ids, strict=True)):
            (refusal, (state, created_at)), entries = answers[2 * index : 2 * index + 2], streams[index]
            if refusal is not None:
                refused = json.loads(refusal)
                entry = output_line(request.custom_id, job_id, refused["status_code"], refused["body"])
            elif request.number > fed or state == JobState.cancelled.value:
                entry = unrun_line(request.custom_id, job_id, *UNRUN.get(ending, UNRUN["cancelled"]))
            elif state is None or not entries:
                entry = unrun_line(request.custom_id, job_id, *LOST)
            else:
                entry = await self._answer(request, job_id, float(created_at), entries)
            succeeded = entry["response"] is not None and entry["response"]["status_code"] == 200
            if successes:
                tally.count(succeeded, lost=entry["error"] is not None and entry["error"]["code"] == LOST[0])
            if succeeded == successes:
                rendered.append(entry)
        return b"".join(json.dumps(entry, separators=(",", ":")).encode() + b"\n" for entry in rendered)

    async def _answer(
        self, request: BatchLine, job_id: str, created_at: float, entries: list[Any]
    ) -> dict[str, Any]:
        """A line whose job ended completed or failed, as its route would have answered."""
        body = request.request(self.endpoint)
        collected = Collected()
        try:
            for _, fields in entries:
                event = event_adapter.validate_json(fields["data"])
                collected.add(event)
                raise_for_failure(event)
        except StreampoolError as exc:
            status, answer = self.driver.failure(exc)
            return output_line(request.custom_id, job_id, status, answer)
        if isinstance(body, EmbeddingsBody):
            return output_line(request.custom_id, job_id, 200, collected.result().pooled or {})
        job = body.job_request(self.settings.max_tokens_limit)
        if isinstance(body, ChatBody | CompletionBody):
            answer_of = Answer(chat=body.chat, job_id=job_id, model=body.model, created=int(created_at))
            return output_line(
                request.custom_id, job_id, 200, whole_answer(body, job, answer_of, collected.result())
            )
        record = await self.driver.store.record(job_id)
        head = Head(job_id, created_at, body.stored(job))
        return output_line(request.custom_id, job_id, 200, response_object(head, Standing.of_record(record)))


@dataclass
class Tally:
    """What a batch's files hold, counted as the output file is written: its lines, those that
    completed, and those whose result was lost."""

    lines: int = 0
    completed: int = 0
    lost: int = 0

    def count(self, completed: bool, lost: bool) -> None:
        self.lines += 1
        self.completed += completed
        self.lost += lost


async def _joined(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`first`, then `rest`: chunks of which the first was read ahead."""
    yield first
    async for chunk in rest:
        yield chunk
