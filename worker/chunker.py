"""Engine deltas to job events: coalescing by `stream_step`, sequence numbers, usage. Pure, no I/O."""

from __future__ import annotations

from shared.events import (
    CancelledEvent,
    DeltaEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    JobState,
    Progress,
    StatusEvent,
    TokenLogprob,
    Usage,
)
from worker.engine import EngineDelta


class Chunker:
    """Holds back tokens until `stream_step` of them are ready, then emits one `delta` event.

    Like TensorRT-LLM's `streaming_step`, a delta carries at least `stream_step` tokens
    (the last may carry fewer): when one engine output brings several tokens at once,
    they stay together, since their text cannot be split token by token.

    Every token the engine produced ends up in exactly one delta event before the
    terminal event, so the stream always adds up to the job's output and usage.
    """

    def __init__(self, stream_step: int, prompt_tokens: int, next_seq: int) -> None:
        self.stream_step = stream_step
        self.prompt_tokens = prompt_tokens
        self.next_seq = next_seq
        self.text_parts: list[str] = []
        self.completion_tokens = 0
        self._text: list[str] = []
        self._token_ids: list[int] = []
        self._logprobs: list[TokenLogprob] | None = None

    @classmethod
    def after(cls, progress: Progress, stream_step: int) -> Chunker:
        """A chunker that goes on from what the job's stream holds: seq, output and usage continue."""
        chunker = cls(stream_step, 0, progress.next_seq)
        chunker.text_parts.append(progress.text)
        chunker.completion_tokens = len(progress.token_ids)
        return chunker

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def usage(self) -> Usage:
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens)

    def _seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def feed(self, delta: EngineDelta) -> list[Event]:
        """Take one step's tokens; a delta event once enough have gathered (or the request ended)."""
        self._text.append(delta.text)
        self.text_parts.append(delta.text)
        self._token_ids.extend(delta.token_ids)
        self.completion_tokens += len(delta.token_ids)
        if delta.logprobs is not None:
            self._logprobs = (self._logprobs or []) + delta.logprobs
        if len(self._token_ids) >= self.stream_step or delta.finished:
            return self.flush()
        return []

    def flush(self) -> list[Event]:
        """The held-back tokens as one delta event, if any."""
        if not self._token_ids and not any(self._text):
            return []
        event = DeltaEvent(
            seq=self._seq(), text="".join(self._text), token_ids=self._token_ids, logprobs=self._logprobs
        )
        self._text, self._token_ids, self._logprobs = [], [], None
        return [event]

    def done(self, finish_reason: str) -> list[Event]:
        """The held-back tokens, then `done` with the finish reason and exact usage."""
        return [*self.flush(), DoneEvent(seq=self._seq(), finish_reason=finish_reason, usage=self.usage)]

    def resumed(self, attempt: int, message: str) -> list[Event]:
        """The `running` status that opens a resumed run."""
        status = StatusEvent(
            seq=self._seq(), state=JobState.running, message=message, resumed=True, attempt=attempt
        )
        return [status]

    def cancelled(self) -> list[Event]:
        return [*self.flush(), CancelledEvent(seq=self._seq(), usage=self.usage)]

    def error(self, message: str, code: str) -> list[Event]:
        return [*self.flush(), ErrorEvent(seq=self._seq(), message=message, code=code)]
