"""Small client-side helpers the tests share: submit a job, read its events over SSE or long-poll."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import httpx
import openai
import redis.asyncio as aioredis
from httpx_sse import EventSource, aconnect_sse
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from shared.config import Settings
from shared.keys import Keys

TERMINAL = {"done", "cancelled", "error"}
# With greedy decoding the default model goes on past 40 tokens after this prompt (many
# plain prompts make an instruct model stop at once); tests that need a long stream use it.
LONG_PROMPT = "The history of the Roman Empire"


@asynccontextmanager
async def in_process_gateway(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a gateway app run in this process (its lifespan included), without a socket."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield http


DEFAULT_DEADLINE_SECONDS = 60.0
# A job on the session's engines may wait behind other tests' jobs.
JOB_DEADLINE_SECONDS = 120.0

T = TypeVar("T")
Chunk = TypeVar("Chunk", bound=openai.BaseModel)


async def eventually(
    check: Callable[[], Awaitable[T]],
    what: str,
    timeout: float = DEFAULT_DEADLINE_SECONDS,
    interval: float = 0.05,
    until: Callable[[T], object] = bool,
) -> T:
    """Await `check()` until `until(answer)` holds (by default: the answer is truthy) and return the
    answer; fail naming `what` (and the last answer) once `timeout` seconds pass. Every polling wait
    of the tests goes through here, so that none leans on the global per-test timeout."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        answer = await check()
        if until(answer):
            return answer
        if asyncio.get_running_loop().time() >= deadline:
            raise AssertionError(f"not within {timeout} s: {what} (last answer: {answer!r})")
        await asyncio.sleep(interval)


def eventually_sync(
    check: Callable[[], T], what: str, timeout: float = DEFAULT_DEADLINE_SECONDS, interval: float = 0.05
) -> T:
    """`eventually` for the waits outside the event loop: the fixtures that start processes."""
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if answer:
            return answer
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout} s: {what} (last answer: {answer!r})")
        time.sleep(interval)


async def submit(client: httpx.AsyncClient, **body: Any) -> str:
    answer = await client.post("/v1/jobs", json=body)
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["id"]
    return job_id


async def read_sse(
    client: httpx.AsyncClient,
    job_id: str,
    last_event_id: str | None = None,
    stop_after: int | None = None,
    into: list[tuple[str, dict[str, Any]]] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """(stream id, event) pairs from the cursor to the terminal event, or the first `stop_after`;
    appended to `into` as they arrive, when given, so that a test can see how far a reader got."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    async with aconnect_sse(client, "GET", f"/v1/jobs/{job_id}/events", headers=headers) as source:
        return await _events_of(source, stop_after, [] if into is None else into)


async def reconnected_mid_stream(
    client: httpx.AsyncClient, job_id: str, resume_through: httpx.AsyncClient | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """The job's stream as a reader gets it that drops after its sixth event and reconnects with
    `Last-Event-ID` (through `resume_through`, another gateway's client, when given), checked against a
    whole read: no gap, no duplicate, every seq in order."""
    first = await read_sse(client, job_id, stop_after=6)
    assert first[-1][1]["type"] == "delta"
    rest = await read_sse(resume_through or client, job_id, last_event_id=first[-1][0])
    whole = await read_sse(client, job_id)
    assert first + rest == whole
    assert [event["seq"] for _, event in whole] == list(range(len(whole)))
    return whole


async def read_sse_through_outages(
    client: httpx.AsyncClient, job_id: str, into: list[tuple[str, dict[str, Any]]]
) -> list[tuple[str, dict[str, Any]]]:
    """`read_sse` from the start as a client that honours the protocol through a Redis outage (a
    failover) reads: it opens the stream again while the gateway answers 503, and after an
    `unavailable` error event (which has no id) it resumes from the last id it had."""
    while True:
        headers = {"Last-Event-ID": into[-1][0]} if into else {}
        async with aconnect_sse(client, "GET", f"/v1/jobs/{job_id}/events", headers=headers) as source:
            if source.response.status_code != 503:
                await _events_of(source, None, into)
                last = into[-1][1]
                if (last["type"], last.get("code")) != ("error", "unavailable"):
                    return into
                into.pop()
        await asyncio.sleep(0.2)


async def submit_and_read_sse(
    client: httpx.AsyncClient, stop_after: int | None = None, **body: Any
) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """Submit with `Accept: text/event-stream`: the job's id and its events, as `read_sse` gives them."""
    async with aconnect_sse(client, "POST", "/v1/jobs", json=body) as source:
        job_id = source.response.headers["X-Streampool-Job-Id"]
        assert source.response.headers["Location"] == f"/v1/jobs/{job_id}"
        return job_id, await _events_of(source, stop_after, [])


async def tgi_stream(
    client: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> tuple[str, list[dict[str, Any]]]:
    """The job id and every event of a TGI stream (`POST /generate_stream`, or `POST /` streaming)."""
    async with asyncio.timeout(JOB_DEADLINE_SECONDS), aconnect_sse(client, "POST", path, json=body) as source:
        assert source.response.status_code == 200, await source.response.aread()
        events = [json.loads(sse.data) async for sse in source.aiter_sse() if sse.data]
    return source.response.headers["X-Streampool-Job-Id"], events


async def _events_of(
    source: EventSource, stop_after: int | None, events: list[tuple[str, dict[str, Any]]]
) -> list[tuple[str, dict[str, Any]]]:
    """The stream's events until its terminal event (or `stop_after`), within JOB_DEADLINE_SECONDS:
    keep-alives would otherwise hold a stream whose end never comes open until the global timeout."""
    assert source.response.status_code == 200, await source.response.aread()
    await asyncio.wait_for(_read_events(source, stop_after, events), JOB_DEADLINE_SECONDS)
    return events


async def _read_events(
    source: EventSource, stop_after: int | None, events: list[tuple[str, dict[str, Any]]]
) -> None:
    async for sse in source.aiter_sse():
        if not sse.data:
            # A keep-alive comment: httpx-sse reports it as an empty event once an id was seen.
            continue
        event = json.loads(sse.data)
        assert sse.event == event["type"]
        events.append((sse.id, event))
        if event["type"] in TERMINAL or (stop_after is not None and len(events) >= stop_after):
            return


async def poll_all(client: httpx.AsyncClient, job_id: str, limit: int = 100) -> list[dict[str, Any]]:
    """Every event of a job by long-polling page after page until `done`."""
    cursor, events = "", []

    async def next_page() -> bool:
        nonlocal cursor
        answer = await client.get(
            f"/v1/jobs/{job_id}/events", params={"after": cursor, "wait": 5, "limit": limit}
        )
        assert answer.status_code == 200, answer.text
        page = answer.json()
        events.extend(page["events"])
        cursor = page["cursor"]
        return bool(page["done"])

    await eventually(next_page, f"the last page of job {job_id}", JOB_DEADLINE_SECONDS, interval=0)
    return events


def completed_batch(
    client: openai.OpenAI, lines: list[dict[str, Any]], endpoint: str
) -> list[dict[str, Any]]:
    """The output file's lines of a batch of `lines` for `endpoint`, run through `client.files` and
    `client.batches` until it completes (with no error file)."""
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    input_file = client.files.create(file=("batch.jsonl", data), purpose="batch")
    batch = client.batches.create(
        input_file_id=input_file.id,
        endpoint=endpoint,  # type: ignore[arg-type]  # one of the package's literal endpoints
        completion_window="24h",
    )
    deadline = time.monotonic() + JOB_DEADLINE_SECONDS
    while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed", "expired"):
        assert time.monotonic() < deadline, f"batch {batch.id} still {batch.status}"
        time.sleep(0.2)
    assert batch.status == "completed" and batch.output_file_id and batch.error_file_id is None, batch
    assert batch.request_counts is not None and batch.request_counts.completed == len(lines)
    assert client.files.retrieve(batch.output_file_id).purpose == "batch_output"
    return [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]


def job_record(base_url: str, job_id: str) -> dict[str, Any]:
    """A job's record (`GET /v1/jobs/{id}`), by its id or its response's (`resp_<id>`), for the tests
    that drive a synchronous client."""
    answer = httpx.get(f"{base_url}/v1/jobs/{job_id.removeprefix('resp_')}", timeout=30)
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


async def record(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    """The job's record, as `GET /v1/jobs/{id}` answers it."""
    answer = await client.get(f"/v1/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    job: dict[str, Any] = answer.json()
    return job


async def wait_until(
    client: httpx.AsyncClient,
    job_id: str,
    done: Callable[[dict[str, Any]], bool],
    what: str,
    timeout: float = JOB_DEADLINE_SECONDS,
) -> dict[str, Any]:
    """The job's record once `done(record)` holds."""
    return await eventually(lambda: record(client, job_id), what, timeout, until=done)


async def wait_for_status(
    client: httpx.AsyncClient, job_id: str, states: set[str], timeout: float = JOB_DEADLINE_SECONDS
) -> dict[str, Any]:
    return await wait_until(
        client, job_id, lambda job: job["status"] in states, f"job {job_id} in {sorted(states)}", timeout
    )


def deltas(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event for event in events if event["type"] == "delta"]


def streamed_text(events: list[dict[str, Any]]) -> str:
    return "".join(event["text"] for event in deltas(events))


def streamed_token_ids(events: list[dict[str, Any]]) -> list[int]:
    return [token for event in deltas(events) for token in event["token_ids"]]


class Scrape:
    """One read of a Prometheus /metrics page: each sample's value by its name and labels."""

    def __init__(self, text: str) -> None:
        self.samples = {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def value(self, name: str, **labels: str) -> float:
        """The sum of the values of the samples of `name` whose labels include `labels` (a metric
        labelled by `model` too sums over the models); 0 for one not exported yet."""
        wanted = labels.items()
        return sum(
            value
            for (sample, sample_labels), value in self.samples.items()
            if sample == name and wanted <= sample_labels
        )

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}


async def scrape(client: httpx.AsyncClient, url: str = "/metrics", token: str | None = None) -> Scrape:
    """One read of `url`, with `token` (the metrics token) as the bearer where given."""
    answer = await client.get(url, headers={"Authorization": f"Bearer {token}"} if token else None)
    assert answer.status_code == 200, answer.text
    return Scrape(answer.text)


async def arq_keys_of(redis: aioredis.Redis, job_ids: list[str]) -> list[str]:
    """What arq would keep of these jobs under its own prefix (`arq:job:<id>`, `arq:retry:<id>`...)."""
    return [name for job_id in job_ids async for name in redis.scan_iter(match=f"arq:*{job_id}")]


async def stream_reader_listening(redis: aioredis.Redis, keys: Keys) -> bool:
    """Whether a gateway's stream reader listens to some notice partition's channel: it watches some
    stream."""
    channels = [keys.notice_channel(partition) for partition in range(keys.notice_partitions)]
    return any(listeners >= 1 for _, listeners in await redis.pubsub_numsub(*channels))


async def notify(redis: aioredis.Redis, keys: Keys, *streams: str) -> None:
    """The notice every script that appends to job streams sends (`Keys.notices_of` its job), for a
    test that writes entries itself."""
    for stream in streams:
        await redis.publish(keys.notices_of(keys.stream_job(stream)), stream)


async def resumed_chunks(
    sdk: openai.AsyncOpenAI, path: str, chunk_type: type[Chunk], starting_after: int
) -> list[Chunk]:
    """The chunks of a kept OpenAI answer's stream (`path`, under the client's base URL) after its first
    `starting_after`, read by the `openai` package as it reads any stream."""
    stream = await sdk.get(
        path,
        cast_to=chunk_type,
        options={"params": {"starting_after": starting_after}},
        stream=True,
        stream_cls=openai.AsyncStream[chunk_type],  # type: ignore[valid-type]
    )
    async with asyncio.timeout(JOB_DEADLINE_SECONDS):
        return [chunk async for chunk in stream]
