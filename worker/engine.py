"""The seam between a job and the engine: submit a request, iterate deltas, abort by id; or, for a
pooling model, answer a pooling request whole (`pool`).

A job of several prompts is one engine request per prompt, under ids of its own (`engine_request_ids`),
whose deltas are merged into one sequence of choices (`generate`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from shared.events import Echo, TokenLogprob, ToolCallDelta
from shared.model_card import ModelCard
from shared.pooling import PoolingJob, PoolingRoute
from shared.requests import JobRequest


@dataclass(slots=True)
class EngineDelta:
    """What one engine step added to one choice (`index`, 0 to n-1) of a request; `finished`: that
    choice has ended, and `stop_reason` names the stop string or token id that ended it, if one did.
    Where the pool parses a chat's output (worker/replies.py), `text` is the content alone, beside the
    `reasoning` and `tool_calls` parts the parsers made of the step's tokens.

    Not frozen, though never changed: one is made per job and step, and a frozen one takes twice as
    long to make."""

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    finished: bool = False
    finish_reason: str | None = None
    index: int = 0
    stop_reason: int | str | None = None
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None  # on a request's first delta, if asked for
    echo: Echo | None = None  # on a request's first delta, if asked for (`prompt_echo`)


ADAPTER_NOT_FOUND = "adapter_not_found"
"""The `code` of the `EngineError` of an adapter's load whose path holds no adapter (vLLM's 404)."""


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter as the engine takes it (vLLM's `LoRARequest`): `number` is its id in this worker's
    engine, new for each load but one in place, which replaces the weights under the same number."""

    name: str
    number: int
    path: str
    load_inplace: bool = False
    is_3d_lora_weight: bool = False


@dataclass(frozen=True)
class Prompt:
    """A request's prompt as the engine sees it: token ids, counted exactly for usage; and for a chat
    whose output is parsed, what vLLM's chat serving gives its engine beside the sampling options
    (`engine_options`: the constraint a tool choice sets, where reasoning ends)."""

    token_ids: list[int]
    request: JobRequest = field(repr=False)
    engine_options: dict[str, Any] = field(default_factory=dict, repr=False)
    adapter: Adapter | None = None  # the LoRA adapter the request runs with, if any

    @classmethod
    def truncated(cls, token_ids: list[int], request: JobRequest, max_model_len: int) -> Prompt:
        """The prompt of `request` (of one prompt) whose tokens are `token_ids`, less what its
        `truncate_prompt_tokens` drops from the start."""
        kept = request.kept_prompt_tokens(len(token_ids), max_model_len)
        return cls(token_ids=list(token_ids[len(token_ids) - kept :]), request=request)

    def continued(self, emitted: list[int]) -> Prompt:
        """This prompt followed by tokens a run already emitted, with what is left of `max_tokens` and
        `min_tokens`: how a resumed job goes on where its last run stopped."""
        if not emitted:
            return self
        left = {
            "max_tokens": self.request.max_tokens - len(emitted),
            "min_tokens": max(self.request.min_tokens - len(emitted), 0),
            "prompt_logprobs": None,  # the first run's first delta has given them
            "echo": False,
        }
        rest = self.request.model_copy(update=left)
        return replace(self, token_ids=self.token_ids + emitted, request=rest)


def prompt_echo(prompt: Prompt, decode: Callable[[list[int]], str]) -> Echo | None:
    """The prompt as the engine sees it, given back where its job asks (`JobRequest.echo`), as vLLM's
    completions give it: a text prompt's own text, token ids decoded (special tokens kept)."""
    if not prompt.request.echo or not prompt.token_ids:
        return None
    given = prompt.request.only_prompt
    text = given if isinstance(given, str) else decode(prompt.token_ids)
    return Echo(text=text, first_token=decode(prompt.token_ids[:1]))


@dataclass(frozen=True)
class Serving:
    """What an engine's model serves, as vLLM's server decides it from the model's tasks: generation
    (its `generate` task), and the pooling routes it answers (`--runner pooling`, `--convert ...`)."""

    generates: bool
    pooling_routes: list[PoolingRoute] = field(default_factory=list)

    def describe(self) -> str:
        """What it serves, in words, for a refusal that names it."""
        served = (["generation"] if self.generates else []) + [f"/{route}" for route in self.pooling_routes]
        return ", ".join(served) or "nothing"


@dataclass(frozen=True)
class PrefixCache:
    """An engine's prefix cache: the tokens a block holds, and how many blocks it has (0: not known)."""

    block_size: int
    blocks: int


class Engine(Protocol):
    """What a worker needs of a generation engine."""

    model_name: str
    max_model_len: int
    max_chars_per_token: int  # the tokenizer's longest token, in characters (vLLM's own figure)
    dtype: str  # what the weights run in, resolved (never `auto`): "bfloat16", "float32", ...
    engine_arguments: dict[str, str]  # vLLM's arguments away from `vllm serve`'s defaults, for heartbeats
    chat_template: str | None  # what chats are rendered with: `--chat-template`'s, or the tokenizer's
    prefix_cache: PrefixCache | None  # None: the engine caches no prefixes

    def render(self, request: JobRequest) -> Prompt:
        """Tokenize the prompt (a request of one), take its token ids as they are, or render `messages`
        with the model's chat template."""
        ...

    def generate(self, request_id: str, prompt: Prompt) -> AsyncGenerator[EngineDelta, None]:
        """Stream the new tokens of every step; closing the iterator aborts the request. A request the
        engine refuses raises `EngineError`; an engine that died raises `EngineDead`."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request and free its KV cache."""
        ...

    async def serving(self) -> Serving:
        """What its model serves: generation, pooling routes, or both."""
        ...

    async def model_card(self) -> ModelCard | None:
        """The card of its model, from the tokenizer it renders with (`worker.model_card`); None where
        none can be made, which only leaves the prompt's length to the worker to check."""
        ...

    async def pool(self, request_id: str, job: PoolingJob) -> dict[str, Any]:
        """The whole answer to a pooling request, as vLLM's server answers its route (its id made of
        `request_id`); cancelling it aborts its engine requests. A request the engine refuses raises
        `EngineError` whose `code` is vLLM's error type (`shared.pooling.POOLING_ERROR_STATUS`)."""
        ...

    async def add_adapter(self, adapter: Adapter) -> None:
        """Load a LoRA adapter (or its new weights, in place) for the requests that name it;
        `EngineError` where it cannot (code `adapter_not_found` where its path holds none)."""
        ...

    async def remove_adapter(self, adapter: Adapter) -> None:
        """Free a LoRA adapter no request runs with any more."""
        ...

    def running_requests(self) -> int:
        """Requests the engine holds now, for heartbeats."""
        ...

    @property
    def dead(self) -> bool:
        """The engine cannot run requests any more (its process died): the worker must be replaced."""
        ...

    def shutdown(self) -> None: ...


async def render(engine: Engine, request: JobRequest) -> list[Prompt]:
    """Each of the request's prompts, tokenized on the event loop when short; long ones take a while to
    tokenize: off the event loop that serves every other job."""
    if request.quick_to_tokenize:
        return [engine.render(one) for one in request.each_prompt()]
    return await asyncio.to_thread(lambda: [engine.render(one) for one in request.each_prompt()])


def engine_request_ids(request_id: str, prompts: int) -> list[str]:
    """The engine's ids of a job's requests: the job's own for one prompt, one apiece for several."""
    return [request_id] if prompts == 1 else [f"{request_id}-{number}" for number in range(prompts)]


def generate(engine: Engine, request_id: str, prompts: list[Prompt]) -> AsyncGenerator[EngineDelta, None]:
    """The deltas of every prompt's request as they come; a choice's `index` counts on from the choices
    of the prompts before it (prompt i's choice j is `i * n + j`, as vLLM numbers a batch's). Closing
    it closes every request."""
    if len(prompts) == 1:
        return engine.generate(request_id, prompts[0])
    return _merged(engine, engine_request_ids(request_id, len(prompts)), prompts)


async def _merged(engine: Engine, ids: list[str], prompts: list[Prompt]) -> AsyncGenerator[EngineDelta, None]:
    arrivals: asyncio.Queue[EngineDelta | Exception | None] = asyncio.Queue()

    async def run(engine_id: str, prompt: Prompt, first_index: int) -> None:
        try:
            async with aclosing(engine.generate(engine_id, prompt)) as deltas:
                async for delta in deltas:
                    arrivals.put_nowait(replace(delta, index=first_index + delta.index))
        except Exception as exc:  # raised where the deltas are read, as one request's would be
            arrivals.put_nowait(exc)
        else:
            arrivals.put_nowait(None)

    first_indexes = [number * prompt.request.n for number, prompt in enumerate(prompts)]
    runs = [
        asyncio.create_task(run(engine_id, prompt, first))
        for engine_id, prompt, first in zip(ids, prompts, first_indexes, strict=True)
    ]
    try:
        running = len(runs)
        while running:
            arrival = await arrivals.get()
            if arrival is None:
                running -= 1
            elif isinstance(arrival, Exception):
                raise arrival
            else:
                yield arrival
    finally:
        for task in runs:
            task.cancel()  # a request cancelled mid-generation is aborted by its engine
        await asyncio.gather(*runs, return_exceptions=True)


async def abort(engine: Engine, request_id: str, prompts: int) -> None:
    """Stop every engine request of a job of `prompts` prompts."""
    for engine_id in engine_request_ids(request_id, prompts):
        await engine.abort(engine_id)
