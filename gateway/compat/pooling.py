"""The bodies of vLLM's pooling routes (`/v1/embeddings`, `/pooling`, `/classify`, `/score`, `/rerank`),
as far as the gateway reads them: the model, and the inputs it counts and bounds. Pure, no I/O.

Each mirrors the union of vLLM's request models of its route (`vllm/entrypoints/pooling/*/protocol.py`)
loosely: the fields that route or bound the job are typed here, every other one is taken as it is
(`extra="allow"`) and passed to the worker, where vLLM's own model of the route checks the whole body.
What a worker could only refuse as an answer no JSON carries (`encoding_format` bytes) is refused here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gateway.compat.openai_bodies import Integer, Name, job_request_of
from shared.errors import InvalidRequest, PromptTooLong
from shared.pooling import PoolingJob, PoolingRoute
from shared.prompt_tokens import PromptCounter
from shared.requests import MAX_PRIORITY, JobRequest
from shared.text import Text

EMBEDDINGS_PATH = "/v1/embeddings"
POOLING_PATH = "/pooling"
CLASSIFY_PATH = "/classify"
SCORE_PATHS = ("/score", "/v1/score")
RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")

Piece = str | list[int]
"""What one input holds to count: a text, or token ids."""
TokenIds = Annotated[list[Annotated[int, Field(strict=True, ge=0)]], Field(min_length=1)]
Message = dict[str, Any]  # vLLM's `ChatCompletionMessageParam`, which its model checks
Conversation = Annotated[list[Message], Field(min_length=1)]
ScoreInput = Text | dict[str, Any]  # vLLM's `ScoreInput`: a text, or `{"content": [parts]}`


def _is_conversation(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def _is_token_ids(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, int) for item in value)


def message_texts(messages: list[Message]) -> Iterator[str]:
    """The texts of a conversation's messages, or of a score input's content parts."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            yield from (part["text"] for part in content if isinstance(part, dict) and "text" in part)


def score_input_texts(value: ScoreInput) -> list[str]:
    return [value] if isinstance(value, str) else list(message_texts([value]))


class PoolingBody(BaseModel):
    """What every pooling route takes: a model, and vLLM's options, passed through."""

    model_config = ConfigDict(extra="allow")

    route: ClassVar[PoolingRoute]

    model: Name | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    priority: Annotated[int, Field(ge=-MAX_PRIORITY, le=MAX_PRIORITY)] | None = None
    add_special_tokens: bool | None = None

    def pieces(self) -> list[list[Piece]]:
        """Each input's texts and token ids, in order: what its tokens are counted from."""
        raise NotImplementedError

    @property
    def special_tokens(self) -> bool:
        """Whether the worker's tokenizer adds the special tokens to a text (vLLM's default: a prompt's
        yes, a conversation's no, as its template holds them)."""
        return True if self.add_special_tokens is None else self.add_special_tokens

    def job_request(self) -> JobRequest:
        """The job: this body as vLLM's model of the route takes it, with its inputs counted."""
        body = self.model_dump(mode="json", exclude_unset=True)
        pooling = PoolingJob(route=self.route, body=body, inputs=len(self.pieces()))
        return job_request_of({"model": self.model, "pooling": pooling, "priority": self.priority}, {})


class _TextsOrChat(PoolingBody):
    """vLLM's completion form (`input`: a text, texts, token ids or lists of them) or its chat form
    (`messages`, or a conversation, or conversations, in `input`); given both, vLLM reads `messages`."""

    input: Text | list[Text] | TokenIds | list[TokenIds] | Conversation | list[Conversation] | None = None
    messages: Conversation | list[Conversation] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> _TextsOrChat:
        if self.input is None and self.messages is None:
            raise ValueError("give 'input' or 'messages'")
        if not self._given():
            raise ValueError("at least one input is required")
        return self

    def _given(self) -> list[Any]:
        """Each input: a text, token ids or a conversation."""
        given = self.messages if self.messages is not None else self.input
        if isinstance(given, str) or _is_conversation(given) or _is_token_ids(given):
            return [given]
        assert isinstance(given, list)
        return given

    @property
    def special_tokens(self) -> bool:
        chat = _is_conversation(self._given()[0])
        return not chat if self.add_special_tokens is None else self.add_special_tokens

    def pieces(self) -> list[list[Piece]]:
        return [list(message_texts(item)) if _is_conversation(item) else [item] for item in self._given()]


class EmbeddingsBody(_TextsOrChat):
    """`POST /v1/embeddings` (vLLM's `EmbeddingRequest`), whose answer is vLLM's `EmbeddingResponse`:
    `float` vectors, or `base64` as vLLM encodes them; `dimensions` where the model takes it."""

    route: ClassVar[PoolingRoute] = "embeddings"

    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Integer | None = None


class PoolingRouteBody(_TextsOrChat):
    """`POST /pooling` (vLLM's `PoolingRequest`): the pooler's output, for the task given or the model's."""

    route: ClassVar[PoolingRoute] = "pooling"

    encoding_format: Literal["float", "base64"] = "float"


class ClassifyBody(_TextsOrChat):
    """`POST /classify` (vLLM's `ClassificationRequest`): each input's label and class probabilities."""

    route: ClassVar[PoolingRoute] = "classify"


class ScoreBody(PoolingBody):
    """`POST /score` and `/v1/score` (vLLM's `ScoreRequest`): the score of each pair of a first input (one
    for all, or one each) and a second, under any of vLLM's names for the two sides."""

    route: ClassVar[PoolingRoute] = "score"
    SIDES: ClassVar[tuple[tuple[str, str], ...]] = (
        ("queries", "documents"),
        ("queries", "items"),
        ("data_1", "data_2"),
        ("text_1", "text_2"),
    )

    queries: ScoreInput | list[ScoreInput] | None = None
    documents: ScoreInput | list[ScoreInput] | None = None
    items: ScoreInput | list[ScoreInput] | None = None
    data_1: ScoreInput | list[ScoreInput] | None = None
    data_2: ScoreInput | list[ScoreInput] | None = None
    text_1: ScoreInput | list[ScoreInput] | None = None
    text_2: ScoreInput | list[ScoreInput] | None = None

    def _sides(self) -> tuple[list[ScoreInput], list[ScoreInput]]:
        for first, second in self.SIDES:
            one, two = getattr(self, first), getattr(self, second)
            if one is not None and two is not None:
                return (one if isinstance(one, list) else [one]), (two if isinstance(two, list) else [two])
        raise ValueError("give the two sides to score: 'queries' and 'documents' (or vLLM's other names)")

    @model_validator(mode="after")
    def _both_sides(self) -> ScoreBody:
        firsts, seconds = self._sides()
        if not firsts or not seconds:
            raise ValueError("each side needs at least one input")
        if len(firsts) not in (1, len(seconds)):
            raise ValueError("Input lengths must be either 1:1, 1:N or N:N")  # vLLM's words
        return self

    def pieces(self) -> list[list[Piece]]:
        """A pair an input: the first side's text (the one, or the pair's own) and the second's."""
        firsts, seconds = self._sides()
        return [
            [*score_input_texts(firsts[0 if len(firsts) == 1 else index]), *score_input_texts(second)]
            for index, second in enumerate(seconds)
        ]


class RerankBody(PoolingBody):
    """`POST /rerank`, `/v1/rerank` and `/v2/rerank` (vLLM's `RerankRequest`, Jina's and Cohere's shape):
    the documents ordered by their relevance to the query, the first `top_n` of them."""

    route: ClassVar[PoolingRoute] = "rerank"

    query: ScoreInput
    documents: ScoreInput | list[ScoreInput]
    top_n: Annotated[int, Field(ge=0)] = 0

    @model_validator(mode="after")
    def _a_document(self) -> RerankBody:
        if not self._documents():
            raise ValueError("at least one document is required")
        return self

    def _documents(self) -> list[ScoreInput]:
        return self.documents if isinstance(self.documents, list) else [self.documents]

    def pieces(self) -> list[list[Piece]]:
        """A document an input, with the query it is scored against."""
        query = score_input_texts(self.query)
        return [[*query, *score_input_texts(document)] for document in self._documents()]


BODIES: dict[PoolingRoute, type[PoolingBody]] = {
    body.route: body for body in (EmbeddingsBody, PoolingRouteBody, ClassifyBody, ScoreBody, RerankBody)
}


INPUT_PARAMS: dict[PoolingRoute, str] = {
    "embeddings": "input",
    "pooling": "input",
    "classify": "input",
    "score": "documents",
    "rerank": "documents",
}
"""The parameter that holds a route's inputs, named where there are too many."""


def pooling_body(job: PoolingJob) -> PoolingBody:
    """A job's body as its route's model reads it (a native API's submission gives it as a dict);
    `InvalidRequest` naming the parameter when it is no request of the route."""
    try:
        return BODIES[job.route].model_validate(job.body)
    except ValidationError as exc:
        error = exc.errors()[0]
        param = ".".join(str(part) for part in error["loc"]) or None
        message = f"{param}: {error['msg']}" if param else error["msg"]
        raise InvalidRequest(message, param=param, code=error["type"]) from None


def pooling_tokens(body: PoolingBody, counter: PromptCounter) -> int:
    """The tokens of the body's inputs together, as the worker's tokenizer counts them (no more of each
    than `truncate_prompt_tokens` keeps; of a conversation, its messages' texts)."""
    context = counter.card.max_model_len
    keep = {None: None, -1: context}.get(body.truncate_prompt_tokens, body.truncate_prompt_tokens)
    total = 0
    for pieces in body.pieces():
        tokens = sum(
            len(piece) if isinstance(piece, list) else len(counter.encode(piece, body.special_tokens))
            for piece in pieces
        )
        total += tokens if keep is None else min(tokens, keep)
    return total


def bounded_pooling(
    job: JobRequest, model: str, counter: PromptCounter | None, max_inputs: int, max_tokens: int
) -> JobRequest:
    """A pooling job as its worker runs it: its body checked as its route's and naming `model` (the
    canonical name its workers serve), its inputs counted; `InvalidRequest` past `max_inputs` inputs,
    `PromptTooLong` past `max_tokens` tokens (counted when the model's card is known), before any job."""
    assert job.pooling is not None
    body = pooling_body(job.pooling)
    inputs = len(body.pieces())
    if inputs > max_inputs:
        raise InvalidRequest(
            f"at most {max_inputs} inputs in one request, not {inputs} (max_pooling_inputs)",
            param=INPUT_PARAMS[job.pooling.route],
            code="too_many_inputs",
        )
    if counter is not None and (tokens := pooling_tokens(body, counter)) > max_tokens:
        raise PromptTooLong(
            f"this request's inputs hold {tokens} tokens; one request may hold at most {max_tokens} "
            "(max_pooling_tokens). Please send fewer or shorter inputs.",
            prompt_tokens=tokens,
            max_pooling_tokens=max_tokens,
        )
    pooling = PoolingJob(route=job.pooling.route, body={**job.pooling.body, "model": model}, inputs=inputs)
    return job.model_copy(update={"pooling": pooling})
