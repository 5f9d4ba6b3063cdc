"""A streamed answer's end, for every API: a failure after the answer started goes out as its last
event, never a silent close, and the answer counts among the open streams while it goes out.

Each API keeps its own shape of that last event (`failure`): the native stream's `error` event, an
OpenAI error chunk, TGI's error message, a Responses `error` event.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Iterable
from contextlib import aclosing
from typing import TypeVar

from gateway.metrics import GatewayMetrics
from shared.errors import StreampoolError

Frame = TypeVar("Frame")


async def streamed_answer(
    frames: AsyncGenerator[Frame, None],
    failure: Callable[[StreampoolError], Iterable[Frame]],
    metrics: GatewayMetrics,
) -> AsyncGenerator[Frame, None]:
    """`frames`, counted in `streampool_sse_streams_open` while they go out; a `StreampoolError` they raise
    ends them with the frames `failure` makes of it. Closing this early closes `frames`."""
    metrics.streams_open.inc()
    try:
        async with aclosing(frames):
            async for frame in frames:
                yield frame
    except StreampoolError as exc:
        for frame in failure(exc):
            yield frame
    finally:
        metrics.streams_open.dec()
