"""vLLM's own serving benchmark client, unchanged, against the gateway and real workers.

`vllm bench serve` is vLLM's command for `vllm.benchmarks.serve`, which has no `__main__`: the
test builds the command's argument parser from the module's `add_cli_args` and calls its `main`,
in a process of its own, as the command does. What it reports is held against the job records
the run left: the jobs it made are the records that appeared under the session's prefix while it
ran (the tests of a session run one at a time).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.conftest import System

NUM_PROMPTS = 24
INPUT_LEN = 32
OUTPUT_LEN = 16
BENCH_TIMEOUT_SECONDS = 300
# The random dataset decodes random token ids: with seed 0, one of its 24 prompts holds a NUL, which
# the gateway takes as vLLM's server does.
SEED = "0"
RUN_BENCHMARK = (
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args())\n"
)


def _job_ids(system: System) -> set[str]:
    """The ids of every job record under the session's prefix (a record's key has no suffix)."""
    with redis.Redis.from_url(system.settings.redis_url, decode_responses=True) as client:
        names = client.scan_iter(match=system.keys.job("*"), count=1000)
        return {name.split(":")[2] for name in names if name.count(":") == 2}


def _usage(system: System, job_id: str) -> dict[str, Any]:
    answer = httpx.get(f"{system.base_url}/v1/jobs/{job_id}", timeout=30)
    assert answer.status_code == 200, answer.text
    record: dict[str, Any] = answer.json()
    assert record["status"] == "completed", record
    usage: dict[str, Any] = record["usage"]
    return usage


@pytest.mark.parametrize(
    ("backend", "endpoint"), [("openai", "/v1/completions"), ("openai-chat", "/v1/chat/completions")]
)
def test_vllm_benchmark_client_runs_unchanged_and_counts_the_job_records_tokens(
    system: System, tmp_path: Path, backend: str, endpoint: str
) -> None:
    before = _job_ids(system)
    command = [
        sys.executable,
        "-c",
        RUN_BENCHMARK,
        *("--backend", backend, "--base-url", system.base_url, "--endpoint", endpoint),
        *("--model", system.settings.model_name, "--tokenizer", str(system.settings.model)),
        *("--dataset-name", "random", "--random-input-len", str(INPUT_LEN)),
        *("--random-output-len", str(OUTPUT_LEN), "--num-prompts", str(NUM_PROMPTS), "--ignore-eos"),
        *("--seed", SEED, "--ready-check-timeout-sec", "0", "--disable-tqdm"),
        *("--save-result", "--result-dir", str(tmp_path), "--result-filename", "result.json"),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=BENCH_TIMEOUT_SECONDS)
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    result = json.loads((tmp_path / "result.json").read_text())

    assert (result["completed"], result["failed"]) == (NUM_PROMPTS, 0), run.stdout[-3000:]
    # Chunks arrived one by one: a client that lost the stream's framing sees them all at the end.
    assert result["median_itl_ms"] > 0, run.stdout[-3000:]
    jobs = _job_ids(system) - before
    assert len(jobs) == NUM_PROMPTS
    usages = [_usage(system, job_id) for job_id in jobs]
    assert result["total_output_tokens"] == sum(usage["completion_tokens"] for usage in usages)
    assert result["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN  # ignore_eos: every job runs to its max
    assert result["total_input_tokens"] == sum(usage["prompt_tokens"] for usage in usages)
