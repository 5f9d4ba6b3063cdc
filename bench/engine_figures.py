"""What the phases on the real engine measured (pure, no I/O): the in-process engine's runs, the first
tokens over the full path, the cancels and the Redis commands of a step; the full path's levels are
`stats.PhaseSummary`."""

from __future__ import annotations

from dataclasses import dataclass

from bench.stats import PhaseSummary

MAX_TOKENS = 2  # of the first-token phase's jobs: their first token streamed by an engine step, as any job's
SHORT_PROMPTS = ("The capital of France is", "One, two, three,", "The sky is", "Water boils at")
"""The first-token phase's jobs: short greedy prompts, so that prefill (and the drift of the machine's
speed, a few per cent of it) is small next to the milliseconds the path adds."""


@dataclass
class EngineRun:
    """One start of the in-process engine: its concurrency levels, then its first-token samples."""

    levels: list[PhaseSummary]
    first_tokens: list[float]  # seconds


@dataclass(frozen=True)
class FirstToken:
    """One job's first token through the full path, in seconds, split where the clocks were read."""

    ttft: float  # client, before the POST, to the first delta's receipt
    to_record: float  # before the POST to the gateway's created_at: client, HTTP, validation, prompt count
    pickup: float  # created_at to started_at: the queue
    to_append: float  # started_at to the first delta's append: start, render, engine, publish
    relay: float  # the first delta's append to its receipt: gateway reader, fan-out, SSE, client


@dataclass(frozen=True)
class CancelSample:
    seconds_to_cancelled_event: float
    steps_after_accepted: int  # vs tokens the client had when the cancel returned
    steps_after_published: int  # vs tokens already in the job's stream when the cancel returned


@dataclass(frozen=True)
class StepCost:
    jobs: int
    steps: int
    calls: dict[str, int]
    round_trips: int

    def per_step(self, *names: str) -> float:
        return sum(self.calls.get(name, 0) for name in names) / self.steps

    @property
    def all_per_step(self) -> float:
        return sum(self.calls.values()) / self.steps

    @property
    def round_trips_per_step(self) -> float:
        return self.round_trips / self.steps
