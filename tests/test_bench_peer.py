"""The comparison with vLLM's own server in bench/RESULTS.md: targets judged on the mean of its two runs."""

from __future__ import annotations

from bench.peer import PeerLevel, PeerRun
from bench.report import GENERATE_ROW, Results, render


def level(concurrency: int, rate: float, ttft: float, itl: float) -> PeerLevel:
    return PeerLevel(concurrency, 8, 0, 8 * 128, rate, ttft, ttft * 2, itl, itl * 2)


def vllm_runs() -> list[PeerRun]:
    """vLLM's server's two runs, before and after streampool's, at 1, 8 and 32 requests."""
    return [
        PeerRun(
            "vLLM's server, run 1", [level(1, 30, 40, 30), level(8, 150, 100, 50), level(32, 300, 200, 100)]
        ),
        PeerRun(
            "vLLM's server, run 2", [level(1, 32, 42, 32), level(8, 160, 110, 52), level(32, 310, 220, 104)]
        ),
    ]


def results(streampool: list[PeerLevel]) -> Results:
    run = Results("make bench", "full", {}, 128, peer_input_len=128, peer_output_len=128)
    run.peer_vllm = vllm_runs()
    run.peer_streampool = PeerRun("streampool", streampool)
    return run


def targets(text: list[str]) -> list[str]:
    """The chat row's targets (the row of /inference/v1/generate has its own: test_bench_generate.py)."""
    rows = [line for line in text if "vLLM's server" in line and line.startswith("| ") and "**" in line]
    return [row for row in rows if not row.startswith(f"| {GENERATE_ROW}")]


def test_targets_met_against_the_mean_of_both_vllm_runs() -> None:
    rows = targets(
        render(
            results([level(1, 30.5, 50, 31.5), level(8, 151, 115, 52), level(32, 301, 230, 105)]),
            ["a", "b"],
            [],
        )
    )
    assert len(rows) == 3
    assert all(row.endswith("**met** |") for row in rows), rows


def test_each_target_missed_on_its_own_figure() -> None:
    slow = results([level(1, 29, 45, 31), level(8, 155, 105, 54), level(32, 305, 240, 102)])
    throughput, itl, ttft = targets(render(slow, ["a", "b"], []))
    assert throughput.endswith("**missed** |")  # 29 / 31 < 0.97 at 1
    assert itl.endswith("**missed** |")  # 54 / 51 > 1.03 at 8
    assert ttft.endswith("**missed** |")  # 240 / 210 > 1.10 at 32
    late = results([level(1, 31, 52, 31), level(8, 155, 105, 51), level(32, 305, 210, 102)])
    assert targets(render(late, ["a", "b"], []))[2].endswith("**missed** |")  # 52 - 41 > 10 ms at 1
