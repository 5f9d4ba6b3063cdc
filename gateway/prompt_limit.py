"""Refusing a prompt that cannot fit the model's context before any job is made (413).

The count comes from the card each model's workers publish; a card is looked at again every
few seconds (its digest only), so a gateway picks up a changed model without a restart.
Without a card (a tokenizer with no `tokenizers` form, or a worker not started yet) the context
comes from the workers' heartbeats (the model registry keeps it once they are gone): the prompt
is then bounded by its characters, as vLLM bounds it before it tokenizes (no token is longer than
the vocabulary's longest), so a prompt far too long is refused here and the worker, which always
checks too, refuses the rest. Only a model no worker has ever announced has no context known:
its jobs are queued unchecked, for the worker an autoscaler starts to check, since refusing
them would keep its queue, and so its workers, at zero.
"""

from __future__ import annotations

import asyncio
import time
from typing import NamedTuple

import redis.asyncio as aioredis

from shared.errors import PromptTooLong
from shared.keys import Keys
from shared.model_card import ModelCard, model_card_digest, read_model_card
from shared.models import ModelEntry
from shared.prompt_tokens import Measure, PromptCounter, least_tokens
from shared.requests import JobRequest
from shared.scheduling import Placement, block_hashes

CARD_REFRESH_SECONDS = 5.0


def prompt_too_long(
    prompt_tokens: int, max_tokens: int, context_length: int, *, at_least: bool = False
) -> PromptTooLong:
    """`at_least`: `prompt_tokens` is the fewest the prompt can be, not its count."""
    least = "at least " if at_least else ""
    return PromptTooLong(
        f"This model's maximum context length is {context_length} tokens. However, you requested "
        f"{least}{prompt_tokens + max_tokens} tokens ({least}{prompt_tokens} in the prompt, {max_tokens} for "
        "the completion). Please reduce the length of the prompt or max_tokens.",
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        context_length=context_length,
    )


class CheckedPrompt(NamedTuple):
    """A request within its model's context, and where the queue places it."""

    request: JobRequest
    placement: Placement


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

    async def card(self, model: str) -> ModelCard | None:
        """The model's card as last read (None while no worker of it has published one)."""
        counter = await self.counter(model)
        return None if counter is None else counter.card

    async def count(self, request: JobRequest, model: str) -> int | None:
        """The prompts' tokens together as the model's workers will count them (after truncation); None
        without a card to count with."""
        counter = await self.counter(model)
        if counter is None:
            return None
        context = counter.card.max_model_len
        measured = await measure_prompt(counter, request, context)
        if measured is None:
            return None
        return sum(request.kept_prompt_tokens(measure.tokens, context) for measure in measured)

    async def check(
        self,
        request: JobRequest,
        model: str,
        announced: ModelEntry | None = None,
        *,
        fill: int | None = None,
        adapter: str | None = None,
    ) -> CheckedPrompt:
        """The request, or `PromptTooLong` with the numbers when a prompt plus `max_tokens` exceed the
        model's context (`InvalidRequest` for a `truncate_prompt_tokens` over it, or a token id the model
        does not have, in the prompt, `logit_bias` or `stop_token_ids`). `announced`: what the model's
        workers' heartbeats said of it, for a model without a card. `fill`: the request named no
        `max_tokens`; as vLLM, it gets as many as the context leaves after its longest prompt, at most
        `fill` (it keeps its own where the prompt cannot be counted). With it, its placement in the
        queue: the prompts' tokens, as counted (at least, without a card), and the leading blocks of its
        first prompt (run with `adapter`), where the card gives the pool's cache block size."""
        counter = await self.counter(model)
        if counter is None:
            if announced is None or announced.max_model_len is None:
                return CheckedPrompt(request, Placement())
            least = _least_measures(request, announced)
            fitted = _fitted(request, announced.max_model_len, least)
            return CheckedPrompt(fitted, Placement(sum(measure.tokens for measure in least)))
        context = counter.card.max_model_len
        for prompt in request.prompts or []:
            if isinstance(prompt, list):
                counter.check_token_ids(prompt, "prompt_token_ids")
        counter.check_sampling_token_ids(request)
        measured = await measure_prompt(counter, request, context)
        if measured is None:
            return CheckedPrompt(request, Placement())
        if fill is not None:
            longest = max(request.kept_prompt_tokens(measure.tokens, context) for measure in measured)
            request = request.model_copy(update={"max_tokens": max(1, min(fill, context - longest))})
        kept = [request.kept_prompt_tokens(measure.tokens, context) for measure in measured]
        first = measured[0]
        block_size = counter.card.cache_block_size
        blocks: list[str] = []
        if (
            block_size
            and first.token_ids is not None
            and kept[0] == first.tokens
            and request.cache_salt is None
        ):
            blocks = block_hashes(first.token_ids, block_size, adapter)
        return CheckedPrompt(_fitted(request, context, measured), Placement(sum(kept), tuple(blocks)))


def _least_measures(request: JobRequest, announced: ModelEntry) -> list[Measure]:
    """Each prompt's fewest tokens, without a card: a text's bounded by its characters, token ids
    counted."""
    prompts = request.prompts
    if prompts is None:
        return [Measure(least_tokens(request.prompt_chars, announced.max_chars_per_token), exact=False)]
    return [
        Measure(len(prompt), exact=True)
        if isinstance(prompt, list)
        else Measure(least_tokens(len(prompt), announced.max_chars_per_token), exact=False)
        for prompt in prompts
    ]


def _fitted(request: JobRequest, context: int, measured: list[Measure]) -> JobRequest:
    """The request, or `PromptTooLong` when one of its prompts (as much of it as truncation keeps) leaves
    no room for `max_tokens` in the context."""
    for measure in measured:
        prompt_tokens = request.kept_prompt_tokens(measure.tokens, context)
        if prompt_tokens + request.max_tokens > context:
            at_least = not measure.exact and prompt_tokens == measure.tokens
            raise prompt_too_long(prompt_tokens, request.max_tokens, context, at_least=at_least)
    return request


async def measure_prompt(counter: PromptCounter, request: JobRequest, context: int) -> list[Measure] | None:
    """`counter.measure` up to what can matter (the context, or what truncation keeps of a prompt),
    off the event loop unless the prompts are quick to tokenize."""
    keep = request.truncation(context)
    at_most = context if keep is None else keep
    if request.quick_to_tokenize:
        return counter.measure(request, at_most)
    return await asyncio.to_thread(counter.measure, request, at_most)
