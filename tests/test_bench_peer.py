"""The comparison with vLLM's own server in bench/RESULTS.md: targets judged on the mean of its two runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from bench.peer_figures import PeerLevel, PeerRun, SideBySide
from bench.peer_report import GENERATE_HEADING, GENERATE_ROW, PEER_HEADING
from bench.report import record, render
from bench.results_figures import Results


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


def row(streampool: list[PeerLevel], command: str = "make bench") -> SideBySide:
    return SideBySide(command, "full", 128, 128, vllm_runs(), PeerRun("streampool", streampool))


def results(streampool: list[PeerLevel]) -> Results:
    return Results("make bench", "full", {}, 128, peer=row(streampool))


def targets(text: list[str]) -> list[str]:
    """The chat row's targets (the row of /inference/v1/generate has its own: test_bench_generate.py)."""
    rows = [line for line in text if "vLLM's server" in line and line.startswith("| ") and "**" in line]
    return [row for row in rows if not row.startswith(f"| {GENERATE_ROW}")]


def test_targets_met_against_the_mean_of_both_vllm_runs() -> None:
    rows = targets(
        render(results([level(1, 30.5, 50, 31.5), level(8, 151, 115, 52), level(32, 301, 230, 105)]))
    )
    assert len(rows) == 4
    assert all(row.endswith("**met** |") for row in rows), rows


def test_each_target_missed_on_its_own_figure() -> None:
    slow = results([level(1, 29, 45, 31), level(8, 155, 105, 54), level(32, 305, 240, 102)])
    throughput, itl, ttft, tail = targets(render(slow))
    assert throughput.endswith("**missed** |")  # 29 / 31 < 0.97 at 1
    assert itl.endswith("**missed** |")  # 54 / 51 > 1.03 at 8
    assert ttft.endswith("**missed** |")  # 240 / 210 > 1.10 at 32
    late = results([level(1, 31, 52, 31), level(8, 155, 105, 51), level(32, 305, 210, 102)])
    assert targets(render(late))[2].endswith("**missed** |")  # 52 - 41 > 10 ms at 1
    assert tail.endswith("**met** |")  # 204 / 204 at 32


def test_the_itl_tail_is_judged_under_load_only() -> None:
    """A stream stalled at 32 requests misses it; at one request at a time there is no neighbour to
    stall it, and the p99 there is left to the p50's target."""
    stalled = PeerLevel(32, 8, 0, 8 * 128, 301, 230, 460, 105, 2410)
    tail = targets(render(results([level(1, 31, 41, 31), level(8, 155, 105, 51), stalled])))[3]
    assert "8: 1.000, 32: 11.814" in tail and tail.endswith("**missed** |")
    lone = PeerLevel(1, 8, 0, 8 * 128, 31, 41, 82, 31, 900)
    tail = targets(render(results([lone, level(8, 155, 105, 51), level(32, 305, 210, 102)])))[3]
    assert tail.endswith("**met** |")


def test_a_run_alone_records_its_row_keeps_the_other_parts_and_renders_section_7_again(
    tmp_path: Path,
) -> None:
    record(
        tmp_path, pickup=[0.001], generate=row([level(1, 31, 41, 31)], "python -m bench.run --only-generate")
    )
    measured = row([level(1, 31, 41, 31), level(8, 155, 105, 51), level(32, 305, 210, 102)])

    record(tmp_path, peer=replace(measured, command="python -m bench.run --only-completions"))

    text = (tmp_path / "RESULTS.md").read_text()
    assert text.count(PEER_HEADING) == 1
    assert (
        text.index(PEER_HEADING)
        < text.index("`python -m bench.run --only-completions`")
        < text.index(GENERATE_HEADING)
        < text.index("`python -m bench.run --only-generate`")
    )
    assert len(targets(text.splitlines())) == 4
    raw = json.loads((tmp_path / "results.json").read_text())
    assert raw["pickup"] == [0.001] and raw["peer"]["streampool"]["levels"][2]["concurrency"] == 32
    assert raw["generate"]["command"] == "python -m bench.run --only-generate"
