"""When a streamed answer's chunks go out: the first with the first token, keep-alive comments before it,
and never a keep-alive while events flow.

A gateway process runs with a heartbeat standing in for a worker, so its jobs stay queued; the
test then writes the job's events itself, with XADD as the worker's publisher does, and watches
what the client receives before and after each one.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import httpx
import openai
import pytest
import redis.asyncio as aioredis

from shared.config import Settings
from shared.events import DeltaEvent, DoneEvent, Event, JobState, StatusEvent, TokenLogprob, Usage
from shared.keys import Keys
from shared.model_card import ModelCard, publish_model_card
from shared.prompt_tokens import PromptCounter
from shared.requests import ChatMessage, JobRequest
from tests.conftest import make_settings
from tests.gateway.stand_ins import CARD_MODEL as MODEL
from tests.gateway.stand_ins import heartbeat
from tests.helpers import JOB_DEADLINE_SECONDS, eventually, notify
from tests.processes import Processes, free_port, wait_answering
from tests.redis_cleanup import delete_prefix

MESSAGES = [{"role": "user", "content": "Hi there!"}]
PING_SECONDS = 0.1
QUIET_SECONDS = 0.5  # how long a queued stream is watched for a chunk that must not come
FLOWING_SECONDS = 0.02  # between two events of a flowing stream: a fifth of the keep-alive interval
MARK = re.compile(r"#(\d+)#")  # a seq, as `_marked` writes it into a delta's text
STREAMED = {  # a streamed request of each API whose answer is made from the job's events
    "openai": ("/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "stream": True}),
    "tgi": ("/generate_stream", {"inputs": "Hi there!", "parameters": {"max_new_tokens": 40}}),
    "responses": ("/v1/responses", {"model": MODEL, "input": "Hi there!", "stream": True}),
    # The native stream, whose live events the stream hub writes itself (`server_send.body_writer`).
    "native": ("/v1/jobs", {"model": MODEL, "prompt": "Hi there!", "max_tokens": 40}),
}
EVENT_STREAM = {"Accept": "text/event-stream"}
JOB_ID_HEADER = "X-Streampool-Job-Id"


@pytest.fixture(scope="module")
def settings(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A gateway process without workers, its jobs queued until the test writes their events."""
    settings = make_settings(
        redis_url,
        port=free_port(),
        host="127.0.0.1",
        allow_unauthenticated=True,
        sse_ping_seconds=PING_SECONDS,
    )
    processes = Processes(tmp_path_factory.mktemp("stream-timing"))
    child = processes.start("gateway", "gateway", settings)
    try:
        wait_answering(f"http://127.0.0.1:{settings.port}", child)
        yield settings
    finally:
        processes.stop_all()
        delete_prefix(redis_url, settings.key_prefix)


@pytest.fixture
async def http(
    settings: Settings, card: ModelCard, redis_client: aioredis.Redis
) -> AsyncIterator[httpx.AsyncClient]:
    keys = Keys.of(settings)
    # Before any request: a gateway that found no card looks again only seconds later.
    await publish_model_card(redis_client, keys, card)
    await heartbeat(redis_client, keys, "stand-in", MODEL)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{settings.port}", timeout=60) as client:
        yield client


@dataclass
class Received:
    """What a client read, frame by frame, with when each frame arrived."""

    body: bytes = b""
    frames: list[tuple[float, str]] = field(default_factory=list)

    def data(self) -> list[str]:
        return [frame.removeprefix("data: ") for _, frame in self.frames if frame.startswith("data: ")]

    def comments(self) -> list[str]:
        return [frame for _, frame in self.frames if frame.startswith(":")]


async def _read(response: httpx.Response, received: Received) -> None:
    pending = b""
    async for part in response.aiter_bytes():
        received.body += part
        *whole, pending = (pending + part.replace(b"\r\n", b"\n")).split(b"\n\n")  # TGI's end in \r\n
        now = time.monotonic()
        received.frames.extend((now, frame.decode()) for frame in whole)


async def _publish(redis_client: aioredis.Redis, settings: Settings, job_id: str, event: Event) -> float:
    """The event appended as a worker appends it; when it was."""
    at = time.monotonic()
    keys = Keys.of(settings)
    await redis_client.xadd(keys.stream(job_id), {"type": event.type, "data": event.model_dump_json()})
    await notify(redis_client, keys, keys.stream(job_id))
    return at


async def test_a_waiting_stream_gets_keep_alive_comments_and_its_first_chunk_with_the_first_token(
    http: httpx.AsyncClient, settings: Settings, redis_client: aioredis.Redis
) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "stream": True}
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        job_id = response.headers[JOB_ID_HEADER]
        received = Received()
        reading = asyncio.create_task(_read(response, received))
        try:
            await asyncio.sleep(QUIET_SECONDS)
            await eventually(_now(received.comments), "a keep-alive while queued")
            assert received.data() == [], "a chunk went out before the first token"
            await _publish(redis_client, settings, job_id, StatusEvent(seq=1, state=JobState.running))
            pings = len(received.comments())
            await eventually(_now(lambda: len(received.comments()) > pings), "a keep-alive after running")
            assert received.data() == []
            assert all(comment.startswith(": ping") for comment in received.comments())

            first_token = await _publish(
                redis_client, settings, job_id, DeltaEvent(seq=2, text="Hi", token_ids=[1])
            )
            await eventually(_now(lambda: len(received.data()) == 2), "the role and the first token")
            assert all(at >= first_token for at, frame in received.frames if frame.startswith("data: "))
            usage = Usage(prompt_tokens=9, completion_tokens=1)
            await _publish(
                redis_client, settings, job_id, DoneEvent(seq=3, finish_reason="stop", usage=usage)
            )
            await asyncio.wait_for(reading, JOB_DEADLINE_SECONDS)
        finally:
            reading.cancel()
    assert b"\r" not in received.body, "OpenAI's and vLLM's streams end lines with \\n alone"
    chunks = received.data()
    assert chunks[0].count('"role": "assistant"') == 1 and '"Hi"' in chunks[1]
    assert chunks[-1] == "[DONE]"


def _now(check: Callable[[], object]) -> Callable[[], Awaitable[object]]:
    """A synchronous check, as `eventually` awaits it."""

    async def checked() -> object:
        return check()

    return checked


async def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(
    http: httpx.AsyncClient, settings: Settings, card: ModelCard, redis_client: aioredis.Redis
) -> None:
    job = JobRequest(messages=[ChatMessage.model_validate(message) for message in MESSAGES])
    prompt_tokens = PromptCounter(card).count(job)
    assert prompt_tokens is not None

    async with openai.AsyncOpenAI(base_url=f"{http.base_url}/v1", api_key="none", max_retries=0) as client:
        async with client.chat.completions.with_streaming_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi there!"}],
            stream=True,
            extra_body={"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        ) as response:
            job_id = response.headers[JOB_ID_HEADER]
            events: list[Event] = [
                StatusEvent(seq=1, state=JobState.running),
                DeltaEvent(seq=2, text="Hel", token_ids=[1, 2]),
                DeltaEvent(seq=3, text="lo", token_ids=[3]),
                DoneEvent(
                    seq=4,
                    finish_reason="length",
                    usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=3),
                ),
            ]
            for event in events:
                await _publish(redis_client, settings, job_id, event)
            stream = await response.parse()
            chunks = [chunk async for chunk in stream]

    usages = [
        (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens) for c in chunks if c.usage
    ]
    assert len(usages) == len(chunks) == 5  # the role, two deltas, the finish reason, the usage
    assert [completion for _, completion, _ in usages] == [0, 2, 3, 3, 3]
    assert {(prompt, total - completion) for prompt, completion, total in usages} == {
        (prompt_tokens, prompt_tokens)
    }
    assert chunks[-1].choices == []


@pytest.mark.parametrize("api", STREAMED)
async def test_a_flowing_stream_gets_no_keep_alive_and_a_silent_one_does(
    api: str, http: httpx.AsyncClient, settings: Settings, redis_client: aioredis.Redis
) -> None:
    """A keep-alive goes out only after `sse_ping_seconds` of silence. On a clock, as sse-starlette's
    own pings go, one lands between two chunks of a flowing stream, and vLLM's benchmark client (which
    strips each read) then holds every later chunk in its buffer: a stall of all streams at once."""
    path, body = STREAMED[api]
    asked = time.monotonic()
    async with http.stream("POST", path, json=body, headers=EVENT_STREAM) as response:
        assert response.status_code == 200, await response.aread()
        job_id = response.headers[JOB_ID_HEADER]
        received = Received()
        reading = asyncio.create_task(_read(response, received))
        try:
            published = {0: asked}  # when each event was appended, by seq: frames carry `_marked(seq)`
            published[1] = await _publish(
                redis_client, settings, job_id, StatusEvent(seq=1, state=JobState.running)
            )
            seq = 1
            began = time.monotonic()
            while time.monotonic() - began < 10 * PING_SECONDS:  # the clock's pings would come 10 times
                seq += 1
                token = TokenLogprob(token_id=1, token=_marked(seq), logprob=-0.5)  # TGI's tokens
                delta = DeltaEvent(seq=seq, text=_marked(seq), token_ids=[1], logprobs=[token])
                published[seq] = await _publish(redis_client, settings, job_id, delta)
                await asyncio.sleep(FLOWING_SECONDS)
            flowed = len(received.frames)
            await eventually(_now(lambda: _pings(received.frames[flowed:])), "a keep-alive in a silence")
            usage = Usage(prompt_tokens=3, completion_tokens=seq - 1)
            await _publish(
                redis_client, settings, job_id, DoneEvent(seq=seq + 1, finish_reason="length", usage=usage)
            )
            await asyncio.wait_for(reading, JOB_DEADLINE_SECONDS)
        finally:
            reading.cancel()
    events = [frame for _, frame in received.frames if not frame.startswith(":")]
    assert len(events) >= seq - 1, received.frames  # every token went out
    # A keep-alive goes out `PING_SECONDS` after the gateway read the newest event any earlier frame
    # carries, which was appended (`published`) before the gateway could read it, and the client reads
    # the keep-alive after it went out: however late a loaded machine runs either side, it arrives at
    # least `PING_SECONDS` after that event was appended. One on a clock lands within a flowing
    # stream's interval (FLOWING_SECONDS) of the newest event.
    newest = 0
    for at, frame in received.frames:
        if frame.startswith(":"):
            since = at - published[newest]
            assert since >= PING_SECONDS, f"a keep-alive {since:.3f} s after event {newest} was appended"
        else:
            newest = max([newest, *map(int, MARK.findall(frame))])


def _marked(seq: int) -> str:
    """A delta's text (and token) that names its seq in whatever frame carries it."""
    return f"#{seq}#"


def _pings(frames: list[tuple[float, str]]) -> bool:
    return any(frame.startswith(": ping") for _, frame in frames)
