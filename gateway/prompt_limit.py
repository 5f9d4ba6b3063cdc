"""Refusing a prompt that cannot fit the model's context before any job is made (413).

The count comes from the card each model's workers publish; a card is looked at again every
few seconds (its digest only), so a gateway picks up a changed model without a restart.
Without a card the check is left to the worker, which always makes it too.
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from shared.errors import PromptTooLong
from shared.keys import Keys
from shared.model_card import model_card_digest, read_model_card
from shared.prompt_tokens import PromptCounter
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


class _Card:
    """What one gateway last read of one model's card."""

    def __init__(self) -> None:
        self.counter: PromptCounter | None = None
        self.looked_at = -float("inf")
        self.lock = asyncio.Lock()

    def fresh(self) -> bool:
        return time.monotonic() - self.looked_at < CARD_REFRESH_SECONDS


class PromptLimit:
    """One gateway's view of each model's context, and the check against it."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._cards: dict[str, _Card] = {}

    async def counter(self, model: str) -> PromptCounter | None:
        """The counter of the model's current card, re-read only when its digest changed."""
        card = self._cards.setdefault(model, _Card())
        if card.fresh():
            return card.counter
        async with card.lock:
            if not card.fresh():
                digest = await model_card_digest(self.redis, self.keys, model)
                if digest is None:
                    card.counter = None
                elif card.counter is None or card.counter.digest != digest:
                    published = await read_model_card(self.redis, self.keys, model)
                    # Parsing megabytes of tokenizer takes a while: off the event loop.
                    card.counter = (
                        None if published is None else await asyncio.to_thread(PromptCounter, published)
                    )
                card.looked_at = time.monotonic()
        return card.counter

    async def count(self, request: JobRequest, model: str) -> int | None:
        """The prompt's tokens as the model's workers will count them; None without a card to count with."""
        counter = await self.counter(model)
        return None if counter is None else await count_prompt(counter, request)

    async def check(self, request: JobRequest, model: str, *, fill: int | None = None) -> JobRequest:
        """The request, or `PromptTooLong` with the numbers when prompt plus `max_tokens` exceed the
        model's context. `fill`: the request named no `max_tokens`; as vLLM, it gets as many as the
        context leaves after the prompt, at most `fill` (it keeps its own where the prompt cannot be
        counted)."""
        counter = await self.counter(model)
        if counter is None:
            return request
        prompt_tokens = await count_prompt(counter, request)
        if prompt_tokens is None:
            return request
        context = counter.card.max_model_len
        prompt_tokens = request.kept_prompt_tokens(prompt_tokens, context)
        if fill is not None:
            request = request.model_copy(update={"max_tokens": max(1, min(fill, context - prompt_tokens))})
        if prompt_tokens + request.max_tokens > context:
            raise prompt_too_long(prompt_tokens, request.max_tokens, context)
        return request


async def count_prompt(counter: PromptCounter, request: JobRequest) -> int | None:
    """`counter.count`, off the event loop unless the prompt is quick to tokenize."""
    if request.quick_to_tokenize:
        return counter.count(request)
    return await asyncio.to_thread(counter.count, request)
