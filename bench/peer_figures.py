"""What a row beside vLLM's own server measured (pure, no I/O): each side's levels, vLLM's server twice
(before streampool and after it) and streampool once, with the workload they ran."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PeerLevel:
    """One level's figures, as vLLM's benchmark client reports them (latencies in ms)."""

    concurrency: int
    completed: int
    failed: int
    output_tokens: int
    output_tokens_per_second: float
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float


@dataclass
class PeerRun:
    """One side's run of every level: vLLM's server (twice, before and after streampool) or streampool."""

    side: str
    levels: list[PeerLevel] = field(default_factory=list)


@dataclass(frozen=True)
class SideBySide:
    """One row beside vLLM's server (vLLM's benchmark client on /v1/completions, or
    `/inference/v1/generate`): the command that measured it, and both sides' runs."""

    command: str
    mode: str
    input_len: int  # tokens of each prompt
    output_len: int  # tokens of each answer
    vllm: list[PeerRun]  # vLLM's server, before streampool and after it
    streampool: PeerRun
