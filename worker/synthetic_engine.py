"""An Engine without a model: tokens drawn from the model card's vocabulary at a GPU's pace.

For load tests of a deployment that has no GPU, and for the tests whose subject is Redis, the
queue, leases or the relay rather than generation. It needs no torch and no weights, only the
model folder's tokenizer files: prompts are rendered and counted exactly as the gateway counts
them, so usage and prompt limits behave as on the real engine. Every running request gets one
token a step, and all of them step together on one clock, as a batch on a GPU does, so the
worker's publisher sees the same per-step bursts.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import zlib
from array import array
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.config import WorkerSettings
from shared.errors import EngineError, InvalidRequest
from shared.events import TokenLogprob, TopLogprob
from shared.model_card import ModelCard
from shared.pooling import PoolingJob
from shared.prompt_tokens import PromptCounter
from shared.requests import JobRequest
from worker import chat_template
from worker.engine import ADAPTER_NOT_FOUND, Adapter, EngineDelta, PrefixCache, Prompt, Serving, prompt_echo
from worker.synthetic_pooling import SyntheticEmbeddings, synthetic_serving

SCRIPT_AFTER_TOOL = "|||"
"""Between a script's two parts: the first answers a request, the second a chat after a tool's result."""

SPECIAL_TOKEN_FIELDS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")


def read_model_card(folder: Path, model: str, max_model_len: int) -> ModelCard:
    """The card of the model in `folder`, read from its tokenizer files alone (no transformers)."""
    try:
        tokenizer_json = (folder / "tokenizer.json").read_text()
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError) as exc:
        needs = "tokenizer.json and tokenizer_config.json"
        raise EngineError(f"{folder}: the synthetic engine reads {needs}") from exc
    template_file = folder / "chat_template.jinja"
    template = template_file.read_text() if template_file.is_file() else config.get("chat_template")
    special: dict[str, str | list[str]] = {}
    for name in SPECIAL_TOKEN_FIELDS:
        value = config.get(name)
        content = value.get("content") if isinstance(value, dict) else value
        if isinstance(content, str):
            special[name] = content
    return ModelCard(
        model=model,
        max_model_len=max_model_len,
        tokenizer_json=tokenizer_json,
        chat_template=template if isinstance(template, str) else None,
        special_tokens=special,
    )


def next_step_at(last: float, now: float, seconds: float) -> float:
    """When the step after the one fired at `last` fires, asked for at `now`: a period after `last`,
    at once when that has passed (the waiters were late), a whole period from now when the clock has
    been idle longer than that."""
    if now - last > 2 * seconds:
        return now + seconds
    return max(last + seconds, now)


class StepClock:
    """One clock for every running request, on a fixed period as a GPU's engine steps: a step fires
    `seconds` after the one before, however long its waiters took over their outputs (a worker
    publishing them), and every request waiting then moves on together. A waiter that comes later
    than that (a worker slower than its engine) has its step at once; one that comes to an idle clock
    waits a whole step. Idle, it keeps no timer."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._waiters: list[asyncio.Future[None]] = []  # the next step's; a timer runs while any wait
        self._last = -math.inf  # when the last step fired, by the loop's clock

    def step(self) -> asyncio.Future[None]:
        """The next step, to await."""
        if self._waiters:  # their loop is the running one: asking asyncio for it costs a system call
            loop = self._waiters[0].get_loop()
        else:
            loop = asyncio.get_running_loop()
            loop.call_at(next_step_at(self._last, loop.time(), self._seconds), self._fire)
        # A future of its own: a waiter cancelled (its request aborted) cancels no other's step. Cheaper
        # than shielding one shared future, which costs two more callbacks a waiter and a step.
        waiter = loop.create_future()
        self._waiters.append(waiter)
        return waiter

    def _fire(self) -> None:
        self._last = asyncio.get_running_loop().time()
        fired, self._waiters = self._waiters, []
        for waiter in fired:
            if not waiter.done():
                waiter.set_result(None)


@dataclass
class _Choice:
    """One choice's state: its tokens, its text so far (`sent` of it handed out), how it ended."""

    index: int
    draw: random.Random
    alternatives: random.Random  # apart from `draw`: asking for logprobs changes no token
    decode: Callable[[int], str]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    sent: int = 0
    script: list[int] | None = None  # the tokens it emits before any drawn one
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # the stop token or string that ended it, as vLLM's
    ended_by_token: bool = False  # by the end of sequence or a stop token id, left out of the text


@dataclass(frozen=True)
class Script:
    """A script's token ids: `first` for a request, `after_tool` for a chat whose last message is a
    tool's result (`first` again when the script has one part)."""

    first: list[int]
    after_tool: list[int]

    @classmethod
    def read(cls, text: str, counter: PromptCounter) -> Script:
        first, separated, after = text.partition(SCRIPT_AFTER_TOOL)
        first_ids = counter.encode(first, add_special_tokens=False)
        return cls(first_ids, counter.encode(after, add_special_tokens=False) if separated else first_ids)

    def tokens_for(self, request: JobRequest, written: int) -> list[int]:
        """What is left to write of the part `request` gets, `written` of its tokens written already."""
        after_tool = request.messages is not None and request.messages[-1].role == "tool"
        return (self.after_tool if after_tool else self.first)[written:]


class SyntheticEngine:
    """The Engine protocol on drawn or scripted tokens: honours `n`, `max_tokens`, `min_tokens`,
    `stop`, `stop_token_ids`, `ignore_eos`, `seed`, `logprobs` and abort; ends at the context length.
    It loads a LoRA adapter as vLLM checks one (a folder with an `adapter_config.json`), and an
    adapter's requests draw other tokens than the base model's, as an adapter's weights would.
    Given vLLM's flags of an embedding pool, it answers embeddings instead (worker/synthetic_pooling.py)."""

    dtype = "synthetic"
    # It caches nothing, but tells its prompts' blocks as vLLM's default cache would hold them, so
    # that the queue's prefix-aware claims run as they do in front of vLLM.
    prefix_cache: PrefixCache | None = PrefixCache(block_size=16, blocks=65_536)

    def __init__(self, settings: WorkerSettings, card: ModelCard) -> None:
        if (template := chat_template.load(settings.chat_template)) is not None:
            card = card.model_copy(update={"chat_template": template})
        self.chat_template = card.chat_template
        self.model_name = settings.model_name
        self.engine_arguments: dict[str, str] = {}  # it takes none of vLLM's
        self.max_model_len = settings.max_model_len
        self.card = card
        self._counter = PromptCounter(card)
        self.max_chars_per_token = self._counter.max_chars_per_token
        self._clock = StepClock(settings.synthetic_step_seconds)
        self._serving = synthetic_serving(settings.engine_args)
        self._embeddings = SyntheticEmbeddings(self._counter, self.model_name, self.max_model_len)
        self._pooling = 0  # pooling requests running
        # Each drawn token ends its choice with this chance: answers of about this many tokens on average.
        mean = settings.synthetic_mean_tokens
        self._eos_chance = 1 / mean if mean else 0.0
        script = settings.synthetic_script
        self._script = None if script is None else Script.read(script, self._counter)
        self._aborted: dict[str, asyncio.Event] = {}
        eos = card.special_tokens.get("eos_token")
        self._eos_id = self._counter.token_id(eos) if isinstance(eos, str) else None
        special = {self._counter.token_id(token) for token in self._special_strings()}
        self._vocabulary = [
            token_id for token_id in range(self._counter.vocabulary_size) if token_id not in special
        ]

    def _special_strings(self) -> list[str]:
        values = self.card.special_tokens.values()
        return [token for value in values for token in ([value] if isinstance(value, str) else value)]

    def render(self, request: JobRequest) -> Prompt:
        prompt = request.only_prompt
        if isinstance(prompt, list):
            ids = prompt
            try:
                self._counter.check_token_ids(ids, "prompt_token_ids")
            except InvalidRequest as exc:  # as vLLM's engine refuses them
                raise EngineError(f"the prompt's token ids: {exc.reason}") from exc
        elif prompt is not None:
            ids = self._counter.encode(prompt, add_special_tokens=True)
        else:
            text = self._counter.render_chat(request)
            if text is None:
                raise EngineError(f"{self.model_name} has no chat template: send a prompt, not messages")
            ids = self._counter.encode(text, add_special_tokens=False)
        return Prompt.truncated(ids, request, self.max_model_len)

    async def generate(self, request_id: str, prompt: Prompt) -> AsyncGenerator[EngineDelta, None]:
        if len(prompt.token_ids) >= self.max_model_len:
            raise EngineError(
                f"the prompt ({len(prompt.token_ids)} tokens) does not fit the context ({self.max_model_len})"
            )
        request = prompt.request
        room = min(request.max_tokens, self.max_model_len - len(prompt.token_ids))
        seed = _seed(request, prompt.token_ids)
        if prompt.adapter is not None:
            seed = zlib.crc32(f"{seed}:{prompt.adapter.path}".encode())
        skip = request.skip_special_tokens
        script = None if self._script is None else self._script.tokens_for(request, self._written(prompt))
        choices = [
            _Choice(
                index,
                random.Random(f"{seed}:{index}"),
                random.Random(f"{seed}:{index}:alternatives"),
                self._counter.text_stream(skip),
                script=script,
            )
            for index in range(request.n)
        ]
        aborted = self._aborted.setdefault(request_id, asyncio.Event())
        echo = prompt_echo(prompt, self._counter.decode)  # on the first choice's first delta
        try:
            while any(choice.finish_reason is None for choice in choices):
                await self._clock.step()
                for choice in choices:
                    if choice.finish_reason is not None:
                        continue
                    if aborted.is_set():
                        choice.finish_reason = "abort"
                        yield self._delta(choice, [], request)
                        continue
                    delta = self._delta(choice, [self._next_token(choice, request, room)], request)
                    delta.echo, echo = echo, None
                    yield delta
        finally:
            self._aborted.pop(request_id, None)

    def _written(self, prompt: Prompt) -> int:
        """The tokens a resumed job's earlier runs wrote: its prompt holds them after the request's own,
        so that a script goes on where the last run stopped, as a model goes on from its own tokens."""
        return len(prompt.token_ids) - len(self.render(prompt.request).token_ids)

    def _next_token(self, choice: _Choice, request: JobRequest, room: int) -> int:
        """The choice's next token, scripted or drawn, and whether it ends the choice."""
        emitted = len(choice.token_ids)
        if self._eos_id is not None and self._ends_here(choice, request):
            token = self._eos_id
            choice.finish_reason, choice.ended_by_token = "stop", True
        else:
            script = choice.script or []
            token = script[emitted] if emitted < len(script) else choice.draw.choice(self._vocabulary)
            if emitted + 1 >= request.min_tokens and token in request.stop_token_ids:
                choice.finish_reason, choice.stop_reason, choice.ended_by_token = "stop", token, True
        choice.token_ids.append(token)
        if choice.finish_reason is None and len(choice.token_ids) >= room:
            choice.finish_reason = "length"
        return token

    def _ends_here(self, choice: _Choice, request: JobRequest) -> bool:
        """The end of sequence comes now: past the script, or by chance without one, where the request
        lets the choice end (past `min_tokens`, without `ignore_eos`); else tokens are drawn on."""
        emitted = len(choice.token_ids)
        if emitted < request.min_tokens or request.ignore_eos:
            return False
        if choice.script is not None:
            return emitted >= len(choice.script)
        return choice.draw.random() < self._eos_chance

    def _delta(self, choice: _Choice, new_ids: list[int], request: JobRequest) -> EngineDelta:
        """The text the new tokens add; a stop string cuts the text (and ends the choice) as vLLM's does."""
        # A token that ended the choice (the end of sequence, a stop token id) is not in the text
        # unless `include_stop_str_in_output`, as vLLM's detokenizer leaves it out.
        shown = new_ids[:-1] if choice.ended_by_token and not request.include_stop_str_in_output else new_ids
        for token_id in shown:
            choice.text += choice.decode(token_id)
        end = len(choice.text)
        cut = _stop_cut(choice.text, choice.sent, request)
        if cut is not None:
            end, choice.finish_reason, choice.stop_reason = max(cut[0], choice.sent), "stop", cut[1]
        elif choice.finish_reason is None:  # what could begin a stop string is held back, as vLLM's is
            end = max(end - _stop_held_back(request), choice.sent)
        added, choice.sent = choice.text[choice.sent : end], end
        return EngineDelta(
            text=added,
            token_ids=new_ids,
            logprobs=None if request.logprobs is None else self._logprobs(choice, new_ids, request.logprobs),
            finished=choice.finish_reason is not None,
            finish_reason=choice.finish_reason,
            index=choice.index,
            stop_reason=choice.stop_reason,
        )

    def _logprobs(self, choice: _Choice, new_ids: list[int], wanted: int) -> list[TokenLogprob]:
        """Every token as likely as any other of the vocabulary: the alternatives are other draws."""
        logprob = -math.log(len(self._vocabulary))
        result = []
        for token_id in new_ids:
            others = [choice.alternatives.choice(self._vocabulary) for _ in range(wanted)]
            top = [token_id, *others][:wanted]
            result.append(
                TokenLogprob(
                    token_id=token_id,
                    token=self._counter.token_strings([token_id])[0],
                    logprob=logprob,
                    rank=1,  # every token is as likely: the sampled one comes first
                    top_logprobs=[
                        TopLogprob(token_id=tid, token=self._counter.token_strings([tid])[0], logprob=logprob)
                        for tid in top
                    ],
                )
            )
        return result

    async def serving(self) -> Serving:
        return self._serving

    async def model_card(self) -> ModelCard:
        return self.card

    async def pool(self, request_id: str, job: PoolingJob) -> dict[str, Any]:
        """Embeddings, a step after the request came: a batch of inputs is one step, as on a GPU."""
        if job.route not in self._serving.pooling_routes:
            raise EngineError(
                f"the synthetic engine does not answer /{job.route}", code="NotImplementedError"
            )
        answer = self._embeddings.answer(request_id, job.body)
        self._pooling += 1
        try:
            await self._clock.step()
        finally:
            self._pooling -= 1
        return answer

    async def abort(self, request_id: str) -> None:
        aborted = self._aborted.get(request_id)
        if aborted is not None:
            aborted.set()

    async def add_adapter(self, adapter: Adapter) -> None:
        if not (Path(adapter.path) / "adapter_config.json").is_file():
            # vLLM's words (`LoRAAdapterNotFoundError`) for a path that holds no adapter
            message = f"Loading lora {adapter.name} failed: No adapter found for {adapter.path}"
            raise EngineError(message, code=ADAPTER_NOT_FOUND)

    async def remove_adapter(self, adapter: Adapter) -> None:
        """Nothing is held for an adapter here but its path, which each request carries."""

    def running_requests(self) -> int:
        return len(self._aborted) + self._pooling

    @property
    def dead(self) -> bool:
        return False

    def shutdown(self) -> None:
        for aborted in self._aborted.values():
            aborted.set()


def _seed(request: JobRequest, prompt_ids: list[int]) -> int:
    """The request's `seed`; without one, the prompt's own for a greedy request (the same prompt, the
    same answer, as greedy decoding gives) and a random one otherwise."""
    if request.seed is not None:
        return request.seed
    if request.temperature == 0:
        return zlib.crc32(array("q", prompt_ids).tobytes())
    return random.randrange(2**63)


def _stop_held_back(request: JobRequest) -> int:
    """How many characters of a running choice's text wait until a stop string can no longer end there."""
    stops = request.stop_strings
    return 0 if not stops or request.include_stop_str_in_output else max(map(len, stops)) - 1


def _stop_cut(text: str, sent: int, request: JobRequest) -> tuple[int, str] | None:
    """Where a stop string that appears in `text` (and not wholly in what was sent) cuts it, and which."""
    cuts = []
    for stop in request.stop_strings:
        found = text.find(stop, max(sent - len(stop) + 1, 0))
        if found != -1:
            cuts.append((found + len(stop) if request.include_stop_str_in_output else found, stop))
    return min(cuts) if cuts else None
