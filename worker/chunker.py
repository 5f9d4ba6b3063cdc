"""Engine deltas to job events: coalescing by `stream_step`, sequence numbers, usage. Pure, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.events import (
    CancelledEvent,
    DeltaEvent,
    DoneEvent,
    ErrorEvent,
    Event,
    JobState,
    Progress,
    StatusEvent,
    ToolCallDelta,
    Usage,
)
from shared.requests import JobOutput
from worker.engine import EngineDelta


@dataclass(slots=True)
class _Choice:
    """One choice's output so far, and the engine deltas it holds back for its next delta event."""

    text_parts: list[str] = field(default_factory=list)
    reasoning_parts: list[str] = field(default_factory=list)
    tool_call_parts: list[ToolCallDelta] = field(default_factory=list)
    tokens: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    held: list[EngineDelta] = field(default_factory=list)
    held_tokens: int = 0


def joined_calls(parts: list[ToolCallDelta]) -> list[ToolCallDelta] | None:
    """Tool-call parts in order, each run of parts of one call joined into one: its id, type and name
    from the first that has them, its argument fragments end to end."""
    joined: list[ToolCallDelta] = []
    for part in parts:
        last = joined[-1] if joined else None
        if last is None or last.index != part.index or (part.id is not None and last.id is not None):
            joined.append(part.model_copy(deep=True))
            continue
        last.id = last.id or part.id
        last.type = last.type or part.type
        last.function.name = last.function.name or part.function.name
        last.function.arguments += part.function.arguments
    return joined or None


class Chunker:
    """Holds back tokens until `stream_step` of them are ready, then emits one `delta` event.

    Like TensorRT-LLM's `streaming_step`, a delta carries at least `stream_step` tokens
    (the last may carry fewer): when one engine output brings several tokens at once,
    they stay together, since their text cannot be split token by token.

    A job with `n` choices holds back each choice's tokens apart; its deltas carry the choice's
    `index` and take their `seq` from the job's one sequence.

    Every token the engine produced ends up in exactly one delta event before the
    terminal event, so the stream always adds up to the job's output and usage.
    """

    def __init__(self, stream_step: int, prompt_tokens: int, next_seq: int, n: int = 1) -> None:
        self.stream_step = stream_step
        self.prompt_tokens = prompt_tokens
        self.next_seq = next_seq
        self._choices = [_Choice() for _ in range(n)]

    @classmethod
    def after(cls, progress: Progress, stream_step: int, n: int = 1) -> Chunker:
        """A chunker that goes on from what the job's stream holds: seq, output and usage continue."""
        chunker = cls(stream_step, 0, progress.next_seq, n)
        first = chunker._choices[0]
        first.text_parts.append(progress.text)
        first.reasoning_parts.append(progress.reasoning)
        first.tool_call_parts.extend(progress.tool_call_parts)
        first.tokens = len(progress.token_ids)
        return chunker

    @property
    def text(self) -> str:
        """The job's output: its first choice's text."""
        return "".join(self._choices[0].text_parts)

    @property
    def output(self) -> JobOutput:
        """The job's output, its first choice's: its text, its token count, and the reasoning and tool
        calls where the pool parses a chat's output."""
        first = self._choices[0]
        progress = Progress(0, [], self.text, "".join(first.reasoning_parts), first.tool_call_parts)
        return JobOutput.of(progress).model_copy(update={"token_count": first.tokens})

    @property
    def completion_tokens(self) -> int:
        """Tokens generated over all choices, as vLLM counts usage."""
        return sum(choice.tokens for choice in self._choices)

    @property
    def usage(self) -> Usage:
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens)

    @property
    def finished(self) -> bool:
        """Every choice has ended: the job is done."""
        return all(choice.finish_reason is not None for choice in self._choices)

    @property
    def finish_reasons(self) -> list[str]:
        return [choice.finish_reason or "stop" for choice in self._choices]

    def _seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def feed(self, delta: EngineDelta) -> list[Event]:
        """Take one step's tokens of one choice; a delta event once enough have gathered (or the
        choice ended)."""
        choice = self._choices[delta.index]
        tokens = len(delta.token_ids)
        choice.text_parts.append(delta.text)
        if delta.reasoning:
            choice.reasoning_parts.append(delta.reasoning)
        if delta.tool_calls:
            choice.tool_call_parts.extend(delta.tool_calls)
        choice.tokens += tokens
        choice.held.append(delta)
        choice.held_tokens += tokens
        if delta.finished:
            choice.finish_reason = delta.finish_reason or "stop"
            choice.stop_reason = delta.stop_reason
        if choice.held_tokens >= self.stream_step or delta.finished:
            return self._flush(delta.index)
        return []

    def _flush(self, index: int) -> list[Event]:
        choice = self._choices[index]
        held, choice.held, choice.held_tokens = choice.held, [], 0
        if len(held) == 1:  # as at every step when `stream_step` is 1: the delta's own, as they are
            one = held[0]
            text, token_ids, logprobs = one.text, one.token_ids, one.logprobs
            reasoning, tool_calls, prompt_logprobs = one.reasoning, one.tool_calls, one.prompt_logprobs
            echo = one.echo
        else:
            text = "".join(delta.text for delta in held)
            token_ids = [token_id for delta in held for token_id in delta.token_ids]
            some = [delta.logprobs for delta in held if delta.logprobs is not None]
            logprobs = [logprob for part in some for logprob in part] if some else None
            reasoning = "".join(delta.reasoning for delta in held)
            tool_calls = joined_calls([call for delta in held for call in delta.tool_calls or []])
            prompt_logprobs = held[0].prompt_logprobs if held else None
            echo = held[0].echo if held else None
        if not token_ids and not text:
            return []
        event = DeltaEvent(seq=self._seq(), index=index, text=text, token_ids=token_ids, logprobs=logprobs)
        if reasoning:
            event.reasoning = reasoning
        if tool_calls:
            event.tool_calls = tool_calls
        if prompt_logprobs is not None:
            event.prompt_logprobs = prompt_logprobs
        if echo is not None:
            event.echo = echo
        return [event]

    def flush(self) -> list[Event]:
        """The held-back tokens of every choice, one delta event each that has any."""
        return [event for index in range(len(self._choices)) for event in self._flush(index)]

    def done(self) -> list[Event]:
        """The held-back tokens, then `done` with the finish reasons and exact usage."""
        events, reasons = self.flush(), self.finish_reasons
        stop_reasons = [choice.stop_reason for choice in self._choices]
        done = DoneEvent(
            seq=self._seq(),
            finish_reason=reasons[0],
            finish_reasons=reasons if len(reasons) > 1 else None,
            stop_reasons=stop_reasons if any(reason is not None for reason in stop_reasons) else None,
            usage=self.usage,
        )
        return [*events, done]

    def pooled(self, result: dict[str, Any]) -> list[Event]:
        """A pooling job's end: `done` with its whole answer, and the prompt tokens it pooled."""
        return [DoneEvent(seq=self._seq(), finish_reason="stop", usage=self.usage, result=result)]

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
