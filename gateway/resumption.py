"""An OpenAI answer that outlives its client: its job kept running past a disconnect, and its chunks
made again, the same, for a client that resumes the stream through any gateway.

A streamed answer's chunks are a function of its job's events and of what the request asked of their
framing alone (`Framing`: kind, model as named, role, usage options, echo), and of its `created`, the
job's own submission time: kept beside the job (its annotations), the framing lets any gateway replay
the job's events from the start through a fresh `ChunkStream` and skip the chunks its client has. Pure,
no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ValidationError

from gateway.compat.openai_answers import Answer, ChunkStream, PromptEcho
from gateway.compat.openai_bodies import ChatBody, CompletionBody

KEEP_RUNNING_HEADER = "X-Streampool-Keep-Running"
"""`true` on a chat completion or completion request: its job runs to its end whether or not its
client stays, as a stored chat completion's (`store: true`) does, and its stream can be resumed."""
FRAMING = "chunk_framing"  # the annotation that keeps a kept answer's framing


def keeps_running(body: CompletionBody | ChatBody, headers: Mapping[str, str]) -> bool:
    """Whether the request's job goes on past its client's disconnect: a stored chat completion, or a
    request that says so in `KEEP_RUNNING_HEADER`."""
    stored = isinstance(body, ChatBody) and body.store is True
    return stored or headers.get(KEEP_RUNNING_HEADER, "").strip().lower() == "true"


class Framing(BaseModel):
    """What an answer's chunks take from its request, beside its job's events."""

    chat: bool
    model: str  # as the request named it: the chunks' `model`
    role: str
    include_usage: bool
    continuous_usage: bool
    prompt_tokens: int | None  # the gateway's count, for `continuous_usage` before the worker's
    echoed: str
    prompt_echo: PromptEcho = PromptEcho.none
    choices_per_prompt: int = 1

    @classmethod
    def of(cls, body: CompletionBody | ChatBody, prompt_tokens: int | None) -> Framing:
        continuous = body.stream_options is not None and body.stream_options.continuous_usage
        return cls(
            chat=body.chat,
            model=body.model,
            role=body.role,
            include_usage=body.include_usage,
            continuous_usage=continuous,
            prompt_tokens=prompt_tokens,
            echoed=body.echoed,
            prompt_echo=body.prompt_echo,
            choices_per_prompt=body.n or 1,
        )

    @classmethod
    def of_annotations(cls, annotations: Mapping[str, str]) -> Framing | None:
        """The framing a kept answer's job keeps; None for a job that keeps none (not kept running, or
        not an OpenAI answer's)."""
        kept = annotations.get(FRAMING)
        if kept is None:
            return None
        try:
            return cls.model_validate_json(kept)
        except ValidationError:
            return None

    def annotations(self) -> dict[str, str]:
        return {FRAMING: self.model_dump_json()}

    def answer(self, job_id: str, created: int) -> Answer:
        return Answer(chat=self.chat, job_id=job_id, model=self.model, created=created, role=self.role)

    def chunks(self, job_id: str, created: int) -> ChunkStream:
        """A fresh framing of the job's events, from its first: the same chunks for the same events."""
        return ChunkStream(
            self.answer(job_id, created),
            self.include_usage,
            self.continuous_usage,
            self.prompt_tokens,
            self.echoed,
            self.prompt_echo,
            self.choices_per_prompt,
        )
