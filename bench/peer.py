"""streampool beside vLLM's own server, both driven by vLLM's benchmark client (`vllm.benchmarks.serve`,
what `vllm bench serve` runs), unchanged, at each concurrency level.

The client runs in this process through the module's own parser and `main_async`, so no `vllm` command is
needed. Its backend is `openai` on /v1/completions: the random dataset's prompts are token sequences
decoded to text, and a completion takes the text as it is, so both servers see the same prompt tokens
(a chat request would wrap them in a template each server renders its own way). The random dataset makes
the client send `ignore_eos`, so every request generates exactly its output length on both sides; the
seed fixes the prompts, and temperature 0 the tokens.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.peer_figures import PeerLevel, PeerRun


@dataclass(frozen=True)
class PeerPlan:
    """The client's workload: prompt and output lengths, and prompts per concurrency level."""

    input_len: int
    output_len: int
    levels: list[tuple[int, int]]  # (max concurrency, prompts)
    seed: int = 0


def _arguments(
    base_url: str, model: Path, served_name: str, plan: PeerPlan, concurrency: int, prompts: int
) -> argparse.Namespace:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()  # type: ignore[no-untyped-call]
    add_cli_args(parser)
    args: argparse.Namespace = parser.parse_args(
        [
            *("--backend", "openai", "--endpoint", "/v1/completions", "--base-url", base_url),
            *("--model", str(model), "--served-model-name", served_name, "--tokenizer", str(model)),
            *("--dataset-name", "random", "--random-input-len", str(plan.input_len)),
            *("--random-output-len", str(plan.output_len), "--seed", str(plan.seed)),
            *("--num-prompts", str(prompts), "--max-concurrency", str(concurrency)),
            *("--temperature", "0", "--ignore-eos", "--num-warmups", "1", "--disable-tqdm"),
            *("--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,99"),
        ]
    )
    return args


async def run(
    side: str,
    base_url: str,
    model: Path,
    served_name: str,
    plan: PeerPlan,
    log: Path,
    on_level: Callable[[], None],
) -> PeerRun:
    """Every level in turn against `base_url`; the client's own printout (its arguments and its summary of
    each level) goes to `log`."""
    from vllm.benchmarks.serve import main_async

    result = PeerRun(side)
    for concurrency, prompts in plan.levels:
        with open(log, "a") as out, contextlib.redirect_stdout(out):
            print(f"== {side}: {prompts} prompts, at most {concurrency} at a time", flush=True)
            figures = await main_async(_arguments(base_url, model, served_name, plan, concurrency, prompts))
        result.levels.append(
            PeerLevel(
                concurrency=concurrency,
                completed=int(figures["completed"]),
                failed=int(figures["failed"]),
                output_tokens=int(figures["total_output_tokens"]),
                output_tokens_per_second=float(figures["output_throughput"]),
                ttft_p50=float(figures["p50_ttft_ms"]),
                ttft_p99=float(figures["p99_ttft_ms"]),
                itl_p50=float(figures["p50_itl_ms"]),
                itl_p99=float(figures["p99_itl_ms"]),
            )
        )
        on_level()
    return result
