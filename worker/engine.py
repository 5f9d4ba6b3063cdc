"""The seam between a job and generation: submit a request, iterate deltas, abort by id."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Protocol

from shared.events import TokenLogprob
from shared.requests import JobRequest


@dataclass(frozen=True)
class EngineDelta:
    """What one engine step added to one choice (`index`, 0 to n-1) of a request; `finished`: that
    choice has ended."""

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    finished: bool = False
    finish_reason: str | None = None
    index: int = 0


@dataclass(frozen=True)
class Prompt:
    """A request's prompt as the engine sees it: token ids, counted exactly for usage."""

    token_ids: list[int]
    request: JobRequest = field(repr=False)

    def continued(self, emitted: list[int]) -> Prompt:
        """This prompt followed by tokens a run already emitted, with what is left of `max_tokens` and
        `min_tokens`: how a resumed job goes on where its last run stopped."""
        if not emitted:
            return self
        left = {
            "max_tokens": self.request.max_tokens - len(emitted),
            "min_tokens": max(self.request.min_tokens - len(emitted), 0),
        }
        rest = self.request.model_copy(update=left)
        return Prompt(token_ids=self.token_ids + emitted, request=rest)


class Engine(Protocol):
    """What a worker needs of a generation engine."""

    model_name: str
    max_model_len: int
    max_chars_per_token: int  # the tokenizer's longest token, in characters (vLLM's own figure)
    dtype: str  # what the weights run in, resolved (never `auto`): "bfloat16", "float32", ...

    def render(self, request: JobRequest) -> Prompt:
        """Tokenize the prompt, or render `messages` with the model's chat template."""
        ...

    def generate(self, request_id: str, prompt: Prompt) -> AsyncGenerator[EngineDelta, None]:
        """Stream the new tokens of every step; closing the iterator aborts the request. A request the
        engine refuses raises `EngineError`; an engine that died raises `EngineDead`."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request and free its KV cache."""
        ...

    def running_requests(self) -> int:
        """Requests the engine holds now, for heartbeats."""
        ...

    @property
    def dead(self) -> bool:
        """The engine cannot run requests any more (its process died): the worker must be replaced."""
        ...

    def shutdown(self) -> None: ...


async def render(engine: Engine, request: JobRequest) -> Prompt:
    """The request's prompt, tokenized on the event loop when short; a long one takes a while to
    tokenize: off the event loop that serves every other job."""
    if request.quick_to_tokenize:
        return engine.render(request)
    return await asyncio.to_thread(engine.render, request)
