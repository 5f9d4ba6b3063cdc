"""Request and response bodies of the native job API."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from shared.chat import ChatMessage as ChatMessage  # part of a job's request: its callers import it here
from shared.chat import ChatOptions, ToolCall
from shared.constraint_bounds import grammar_problem, regex_problem, schema_problem
from shared.errors import InvalidRequest
from shared.events import JobState, Progress, Usage, whole_calls
from shared.pooling import PoolingJob
from shared.text import Text as Text  # callers of the job models import it here

MAX_PROMPT_CHARS = 1_000_000
MAX_MODEL_NAME_CHARS = 256
MAX_MESSAGES = 1024
MAX_PROMPTS = 1024
"""The most prompts one request may give as a list; a gateway's `max_prompts` may bound them lower."""
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS_ENTRIES = 300  # OpenAI's own limit
MAX_GRAMMAR_CHARS = 65_536
MAX_CHOICES_OF_OUTPUT = 256
MAX_PRIORITY = 1_000_000
"""The bound of a job's priority either way; lower runs first, as in vLLM."""
MAX_TOKEN_ID = 2**31 - 1  # vLLM checks the model's vocabulary, which no model comes near to this
QUICK_TO_TOKENIZE_CHARS = 2_000
"""A prompt this short is tokenized on the event loop (well under a millisecond): a thread hop costs more."""


StopString = Annotated[Text, Field(min_length=1, max_length=MAX_STOP_CHARS)]
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
TokenIdKey = Annotated[str, Field(pattern=r"^(0|[1-9][0-9]{0,9})$")]
"""A token id as a JSON object key: OpenAI's `logit_bias` keys are strings of digits."""
PromptText = Annotated[Text, Field(min_length=1, max_length=MAX_PROMPT_CHARS)]
PromptTokenIds = Annotated[list[TokenId], Field(min_length=1, max_length=MAX_PROMPT_CHARS)]
PromptInput = str | list[int]
"""One prompt as the engine takes it: a text to tokenize, or the token ids themselves."""
Deadline = Annotated[AwareDatetime, Field(strict=False)]
"""An instant, RFC 3339 or unix seconds: a request's `deadline`, under that name on every API's body."""
CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")  # what vLLM refuses in a salt
MAX_CACHE_SALT_CHARS = 128  # vLLM's bound


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: exactly one constraint the output must satisfy."""

    model_config = ConfigDict(extra="forbid", strict=True, serialize_by_alias=True)

    json_: dict[str, Any] | Text | None = Field(
        None, alias="json", description="a JSON schema (an object, or its JSON text)"
    )
    regex: Text | None = Field(None, min_length=1, max_length=MAX_GRAMMAR_CHARS)
    choice: list[Annotated[Text, Field(max_length=MAX_STOP_CHARS)]] | None = Field(
        None, min_length=1, max_length=MAX_CHOICES_OF_OUTPUT
    )
    grammar: Text | None = Field(None, min_length=1, max_length=MAX_GRAMMAR_CHARS)
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: Text | None = Field(None, max_length=MAX_STOP_CHARS)

    @field_validator("json_")
    @classmethod
    def _small_schema(cls, schema: dict[str, Any] | str | None) -> dict[str, Any] | str | None:
        text = schema if isinstance(schema, str | None) else json.dumps(schema)
        if text is not None and len(text) > MAX_GRAMMAR_CHARS:
            raise ValueError(f"must be at most {MAX_GRAMMAR_CHARS} characters of JSON")
        if schema is not None and (problem := schema_problem(schema)) is not None:
            raise ValueError(f"refused before compiling: {problem}")
        return schema

    @field_validator("regex", "whitespace_pattern")
    @classmethod
    def _quick_regex(cls, pattern: str | None) -> str | None:
        """Patterns the grammar compiler would take seconds over are refused here, before any job
        (shared/constraint_bounds.py)."""
        if pattern is not None and (problem := regex_problem(pattern)) is not None:
            raise ValueError(f"refused before compiling: {problem}")
        return pattern

    @field_validator("grammar")
    @classmethod
    def _quick_grammar(cls, grammar: str | None) -> str | None:
        if grammar is not None and (problem := grammar_problem(grammar)) is not None:
            raise ValueError(f"refused before compiling: {problem}")
        return grammar

    @model_validator(mode="after")
    def _one_constraint(self) -> StructuredOutputs:
        given = [name for name in CONSTRAINTS if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValueError("give exactly one of 'json', 'regex', 'choice', 'grammar' or 'json_object'")
        return self


CONSTRAINTS = ("json_", "regex", "choice", "grammar", "json_object")


GREEDY_BELOW = 1e-5
"""A temperature under this is greedy sampling, as vLLM counts it."""


class JobRequest(ChatOptions):
    """What to generate and how; one of `prompt` (text), `prompt_token_ids` (exactly the tokens the
    engine sees) or `messages` (rendered with the chat template, with the chat's options: tools and
    the template's controls). A list of prompts is several: each gets `n` choices, choice `i * n + j`
    being prompt i's j-th, as vLLM indexes them."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: Text | None = Field(
        None,
        min_length=1,
        max_length=MAX_MODEL_NAME_CHARS,
        description="a model's name or alias, an adapter's name, or model:adapter; required where the "
        "gateway knows several models and sets no default_model",
    )
    prompt: PromptText | Annotated[list[PromptText], Field(min_length=1, max_length=MAX_PROMPTS)] | None = (
        Field(None, description="a text, or a list of texts (several prompts)")
    )
    prompt_token_ids: (
        PromptTokenIds | Annotated[list[PromptTokenIds], Field(min_length=1, max_length=MAX_PROMPTS)] | None
    ) = Field(
        None,
        description="the prompt as token ids, used as they are (no special tokens added); a list of "
        "lists is several prompts. Ids the model's vocabulary lacks are refused",
    )
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int = Field(256, ge=1, le=1_000_000)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    n: int = Field(1, ge=1, le=64, description="choices to generate from the prompt; at most max_choices")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=1, le=100_000)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = Field(
        None, description="strings that end generation"
    )
    stop_token_ids: list[TokenId] = Field(
        [], max_length=MAX_STOP_TOKEN_IDS, description="tokens that end generation"
    )
    include_stop_str_in_output: bool = False
    ignore_eos: bool = Field(False, description="go on past the end-of-sequence token up to max_tokens")
    min_tokens: int = Field(
        0, ge=0, le=1_000_000, description="tokens before an end or stop may end generation"
    )
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=100.0, allow_inf_nan=False)
    logit_bias: dict[TokenIdKey, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = Field(
        None, max_length=MAX_LOGIT_BIAS_ENTRIES, description="token id (a string) -> bias added to its logit"
    )
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    structured_outputs: StructuredOutputs | None = None
    truncate_prompt_tokens: int | None = Field(
        None, ge=-1, le=1_000_000, description="keep only the prompt's last tokens; -1: as many as fit"
    )
    priority: int | None = Field(
        None,
        ge=-MAX_PRIORITY,
        le=MAX_PRIORITY,
        description="the job's place among its tenant's queued jobs, lower first (vLLM's order), and "
        "in vLLM's scheduler where the worker has priority scheduling; default: the tenant's "
        "default_priority; never below its min_priority",
    )
    cache_salt: Text | None = Field(
        None,
        min_length=1,
        max_length=MAX_CACHE_SALT_CHARS,
        description="salts the engine's prefix cache: only requests with the same salt share cached "
        "prompt blocks (vLLM's `cache_salt`)",
    )
    stream_step: int = Field(1, ge=1, le=1024, description="tokens per delta event")
    logprobs: int | None = Field(None, ge=0, le=20, description="alternatives to report per token")
    prompt_logprobs: int | None = Field(
        None,
        ge=0,
        le=20,
        description="the prompt's tokens' log-probabilities, with this many alternatives each (vLLM's), "
        "on the job's first delta event",
    )
    echo: bool = Field(
        False,
        exclude_if=lambda echo: not echo,  # a job that asks none stays readable by a worker before it
        description="the first delta event of each prompt's first choice carries the prompt back (its "
        "text, decoded where it was given as token ids), for a completion's `echo`; a job of prompts",
    )
    deadline: Deadline | None = Field(
        None, description="RFC 3339 or unix seconds; still queued then, the job fails unrun"
    )
    pooling: PoolingJob | None = Field(
        None,
        description="a pooling request (embeddings, pooling, classify, score, rerank) for a pooling model, "
        "instead of a prompt: its answer is the job's `done` event's `result`",
    )

    @field_serializer("deadline")
    def _deadline_as_unix_seconds(self, deadline: datetime | None) -> float | None:
        """Unix seconds, which the job store's start script compares with its clock."""
        return None if deadline is None else deadline.timestamp()

    @field_validator("n")
    @classmethod
    def _one_when_greedy(cls, n: int, info: ValidationInfo) -> int:
        """As vLLM: greedy choices would all be the same one (checked after `temperature`)."""
        if n > 1 and info.data.get("temperature", 1.0) < GREEDY_BELOW:
            raise ValueError("must be 1 when sampling greedily (temperature 0)")
        return n

    @field_validator("min_tokens")
    @classmethod
    def _at_most_max_tokens(cls, min_tokens: int, info: ValidationInfo) -> int:
        if min_tokens > info.data.get("max_tokens", min_tokens):
            raise ValueError("must not exceed max_tokens")
        return min_tokens

    @field_validator("cache_salt")
    @classmethod
    def _salt_vllm_takes(cls, salt: str | None) -> str | None:
        if salt is not None and not CACHE_SALT_FORBIDDEN.isdisjoint(salt):
            raise ValueError("must not contain '@', '/', '\\' or NUL")
        return salt

    @model_validator(mode="after")
    def _one_input(self) -> JobRequest:
        given = [self.prompt, self.prompt_token_ids, self.messages, self.pooling]
        if sum(value is not None for value in given) != 1:
            raise ValueError("give exactly one of 'prompt', 'prompt_token_ids', 'messages' or 'pooling'")
        if self.messages is None:
            options = ChatOptions.model_fields.items()
            chat_only = [name for name, field in options if getattr(self, name) != field.default]
            if chat_only:
                raise ValueError(f"{', '.join(chat_only)}: only a chat (messages) takes these")
        if self.echo and self.prompts is None:
            raise ValueError("echo: only a job of prompts (texts or token ids) gives them back")
        return self

    @property
    def prompts(self) -> list[PromptInput] | None:
        """Each prompt, a text or token ids; None for a chat (`messages`)."""
        if self.prompt_token_ids is not None:
            ids = self.prompt_token_ids
            return list(ids) if isinstance(ids[0], list) else [ids]
        if self.prompt is not None:
            return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)
        return None

    @property
    def only_prompt(self) -> PromptInput | None:
        """The prompt of a request of one (as each of `each_prompt` is); None for a chat."""
        prompts = self.prompts
        if prompts is None:
            return None
        if len(prompts) != 1:
            raise ValueError(f"a request of {len(prompts)} prompts: take each_prompt() one by one")
        return prompts[0]

    @property
    def prompt_count(self) -> int:
        """How many prompts the request gives: a chat is one."""
        prompts = self.prompts
        return 1 if prompts is None else len(prompts)

    @property
    def choices(self) -> int:
        """How many choices the job generates: `n` for each prompt."""
        return self.n * self.prompt_count

    def each_prompt(self) -> list[JobRequest]:
        """The request once for each of its prompts, each a request of that prompt alone (the request
        itself when it has one)."""
        prompts = self.prompts
        if prompts is None or len(prompts) == 1:
            return [self]
        field = "prompt" if self.prompt is not None else "prompt_token_ids"
        return [self.model_copy(update={field: prompt}) for prompt in prompts]

    @property
    def prompt_chars(self) -> int:
        """The characters of the prompts' texts, or of the messages' contents (0 for token ids)."""
        texts = [prompt for prompt in self.prompts or [] if isinstance(prompt, str)]
        return sum(map(len, texts)) + sum(message.chars for message in self.messages or [])

    @property
    def quick_to_tokenize(self) -> bool:
        """Short enough to tokenize on the event loop; a longer prompt goes to a thread."""
        return self.prompt_chars <= QUICK_TO_TOKENIZE_CHARS

    def truncation(self, max_model_len: int) -> int | None:
        """How many of the prompt's last tokens the engine keeps at most; None: all of them.

        `truncate_prompt_tokens` is bounded by the context as vLLM's server bounds it: over the context
        it is refused (`InvalidRequest`). -1 keeps as many as the context holds beside `max_tokens`, and
        at least one: vLLM 0.32 keeps one less than the context and then lowers `max_tokens` to what is
        left, where streampool keeps the `max_tokens` asked for, as it never lowers it elsewhere.
        """
        keep = self.truncate_prompt_tokens
        if keep is None:
            return None
        if keep > max_model_len:
            raise InvalidRequest.of_field(
                "truncate_prompt_tokens",
                f"{keep} cannot be greater than max_model_len = {max_model_len}. Please request a smaller "
                "truncation size.",
            )
        return max(max_model_len - self.max_tokens, 1) if keep == -1 else keep

    def kept_prompt_tokens(self, prompt_tokens: int, max_model_len: int) -> int:
        """How many of the prompt's tokens the engine sees: the last `truncation` ones, as vLLM keeps them."""
        keep = self.truncation(max_model_len)
        return prompt_tokens if keep is None else min(prompt_tokens, keep)

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


MAX_URL_CHARS = 2048


class JobSubmission(JobRequest):
    """`POST /v1/jobs`'s body: the job, and where to announce its end. The webhook is no part of the
    job: neither the request the worker reads nor the idempotency digest holds it (`exclude`)."""

    webhook: Text | None = Field(
        None,
        exclude=True,
        min_length=1,
        max_length=MAX_URL_CHARS,
        description="URL POSTed to once the job ends (signed; see docs/webhooks.md); default: the "
        "API key's own. Must be under one of the gateway's webhook_allowed_prefixes.",
    )


class ErrorBody(BaseModel):
    """Every error answer of the native and TGI routes; some carry more fields (`detail`, ...)."""

    model_config = ConfigDict(extra="allow")

    error: str
    error_type: str


class JobUrls(BaseModel):
    self: str
    events: str
    cancel: str


class JobAccepted(BaseModel):
    """Answer to a submission (202)."""

    id: str
    status: JobState
    created_at: datetime
    urls: JobUrls


class JobOutput(BaseModel):
    """The job's output (its first choice's): where its pool parses a chat's output, `text` is the
    answer's content, beside the model's `reasoning` and its `tool_calls`; a pooling job's is its
    `result`."""

    text: str
    token_count: int
    reasoning: str | None = Field(None, exclude_if=lambda value: value is None)
    tool_calls: list[ToolCall] | None = Field(None, exclude_if=lambda value: value is None)
    result: dict[str, Any] | None = Field(
        None,
        exclude_if=lambda value: value is None,
        description="a pooling job's whole answer, as vLLM's server gives it (its `done` event's `result`)",
    )

    @classmethod
    def of(cls, progress: Progress) -> JobOutput:
        """The output a stream holds so far."""
        calls = whole_calls(progress.tool_call_parts)
        return cls(
            text=progress.text,
            token_count=len(progress.token_ids),
            reasoning=progress.reasoning or None,
            tool_calls=calls or None,
        )


class JobRecord(BaseModel):
    """What `GET /v1/jobs/{id}` answers."""

    id: str
    status: JobState
    model: str | None = Field(None, description="the canonical name of the job's model, whose queue it is on")
    adapter: str | None = Field(None, description="the LoRA adapter of that model the job runs with")
    waiting: str | None = Field(
        None, description="what a queued job waits for, when no worker of its model is live"
    )
    worker: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    output: JobOutput
    finish_reason: str | None = None
    usage: Usage | None = None
    error: str | None = None
    queue_position: int | None = None
    attempts: int = Field(0, description="runs so far: 1 once started, one more each time it was resumed")


class CancelAnswer(BaseModel):
    id: str
    status: JobState
    message: str


class EventsPage(BaseModel):
    """A long-poll answer: the events after the cursor, and the cursor to ask from next."""

    events: list[dict[str, object]]
    cursor: str
    status: JobState
    done: bool
