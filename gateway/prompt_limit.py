"""Refusing a prompt that cannot fit the model's context before any job is made (413).

The count comes from the model card the workers publish; the card is looked at again
every few seconds (its digest only), so a gateway picks up a new model without a restart.
Without a card the check is left to the worker, which always makes it too.
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from gateway.metrics import GatewayMetrics
from gateway.prompt_tokens import PromptCounter
from shared.errors import PromptTooLong
from shared.keys import Keys
from shared.model_card import model_card_digest, read_model_card
from shared.requests import JobRequest

CARD_REFRESH_SECONDS = 5.0


def prompt_too_long(prompt_tokens: int, max_tokens: int, context_length: int) -> PromptTooLong:
    return PromptTooLong(
        f"This model's maximum context length is {context_length} tokens. However, you requested "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} for the "
        "completion). Please reduce the length of the prompt or max_tokens.",
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        context_length=context_length,
    )


class PromptLimit:
    """One gateway's view of the served model's context, and the check against it."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, metrics: GatewayMetrics) -> None:
        self.redis = redis
        self.keys = keys
        self.metrics = metrics
        self._counter: PromptCounter | None = None
        self._looked_at = -float("inf")
        self._lock = asyncio.Lock()

    async def counter(self) -> PromptCounter | None:
        """The counter of the current card, re-read only when its digest changed."""
        if time.monotonic() - self._looked_at < CARD_REFRESH_SECONDS:
            return self._counter
        async with self._lock:
            if time.monotonic() - self._looked_at >= CARD_REFRESH_SECONDS:
                digest = await model_card_digest(self.redis, self.keys)
                if digest is None:
                    self._counter = None
                elif self._counter is None or self._counter.digest != digest:
                    card = await read_model_card(self.redis, self.keys)
                    # Parsing megabytes of tokenizer takes a while: off the event loop.
                    self._counter = None if card is None else await asyncio.to_thread(PromptCounter, card)
                self._looked_at = time.monotonic()
        return self._counter

    async def check(self, request: JobRequest) -> None:
        """`PromptTooLong`, with the numbers, when prompt plus `max_tokens` exceed the context."""
        counter = await self.counter()
        if counter is None:
            return
        if request.quick_to_tokenize:
            prompt_tokens = counter.count(request)
        else:
            prompt_tokens = await asyncio.to_thread(counter.count, request)
        context = counter.card.max_model_len
        if prompt_tokens is not None and prompt_tokens + request.max_tokens > context:
            self.metrics.jobs_rejected.labels(reason="prompt_too_long").inc()
            raise prompt_too_long(prompt_tokens, request.max_tokens, context)
