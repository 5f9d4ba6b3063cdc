"""The row of `/inference/v1/generate` beside vLLM's own server (bench/generate_client.py): its prompts,
how a streamed chunk is read and a level figured, section 7b and its targets in RESULTS.md, and the
in-place update a run of the row alone makes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.generate_client import body, level_figures, read_chunk, token_prompts
from bench.peer_figures import PeerLevel, PeerRun, SideBySide
from bench.peer_report import GENERATE_HEADING, GENERATE_ROW
from bench.report import record, render
from bench.results_figures import Results
from bench.stats import StreamTiming
from shared.requests import JobRequest
from tests.test_bench_peer import level, vllm_runs

VOCABULARY = 49152


def chunk(token_ids: list[int], finish_reason: str | None = None) -> str:
    choice = {"index": 0, "finish_reason": finish_reason, "token_ids": token_ids}
    return json.dumps({"request_id": "r", "usage": None, "output_mode": "tokens", "choices": [choice]})


def results(streampool: list[PeerLevel]) -> Results:
    return Results("make bench", "full", {}, 128, generate=generate_row(streampool))


def generate_row(streampool: list[PeerLevel]) -> SideBySide:
    command = "python -m bench.run --only-generate"
    return SideBySide(command, "full", 128, 128, vllm_runs(), PeerRun("streampool", streampool))


def targets(text: list[str]) -> list[str]:
    return [line for line in text if line.startswith(f"| {GENERATE_ROW}")]


def test_prompts_are_the_same_for_a_seed_and_drawn_from_the_vocabulary() -> None:
    prompts = token_prompts(VOCABULARY, 128, 96, seed=0)
    assert prompts == token_prompts(VOCABULARY, 128, 96, seed=0) != token_prompts(VOCABULARY, 128, 96, seed=1)
    assert [len(prompt) for prompt in prompts] == [128] * 96
    assert all(0 <= token < VOCABULARY for prompt in prompts for token in prompt)
    assert token_prompts(VOCABULARY, 128, 8, seed=0) == prompts[:8]  # each level draws from the same ones


def test_the_request_streams_the_token_ids_greedily_past_the_end_of_sequence() -> None:
    request = JobRequest(prompt_token_ids=[5, 6, 7], max_tokens=128, temperature=0.0, ignore_eos=True)
    assert body("smol", request) == {
        "model": "smol",
        "token_ids": [5, 6, 7],
        "sampling_params": {"max_tokens": 128, "temperature": 0.0, "ignore_eos": True},
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_tokens_arrive_with_their_chunks_and_the_output_is_the_final_usage() -> None:
    timing = StreamTiming(started=10.0)
    read_chunk(chunk([1]), timing, 10.2)
    read_chunk(chunk([2, 3]), timing, 10.4)
    read_chunk(chunk([], "length"), timing, 10.41)  # the choice's end alone: no tokens, no gap
    assert timing.tokens == 3
    read_chunk(
        json.dumps({"request_id": "r", "usage": {"completion_tokens": 4}, "choices": []}), timing, 10.5
    )
    read_chunk("[DONE]", timing, 10.6)
    assert timing.ttft == pytest.approx(0.2)
    assert timing.inter_token() == pytest.approx([0.1, 0.1])
    assert timing.tokens == 4


def test_a_level_counts_failed_requests_apart_and_reports_milliseconds() -> None:
    done = StreamTiming(started=0.0, arrivals=[(0.1, 1), (0.14, 1)], tokens=2)
    failed = StreamTiming(started=0.0)
    figures = level_figures(8, [done, failed, done], seconds=2.0)
    assert (figures.completed, figures.failed, figures.output_tokens) == (2, 1, 4)
    assert figures.output_tokens_per_second == pytest.approx(2.0)
    assert figures.ttft_p50 == pytest.approx(100.0) and figures.itl_p99 == pytest.approx(40.0)


def test_the_rows_targets_are_judged_as_the_chat_rows_on_the_mean_of_both_vllm_runs() -> None:
    met = targets(
        render(results([level(1, 30.5, 50, 31.5), level(8, 151, 115, 52), level(32, 301, 230, 105)]))
    )
    assert len(met) == 4 and all(row.endswith("**met** |") for row in met), met
    slow = results([level(1, 29, 45, 31), level(8, 155, 105, 54), level(32, 305, 240, 102)])
    assert all(row.endswith("**missed** |") for row in targets(render(slow))[:3])
    text = render(slow)
    assert text.index(GENERATE_HEADING) < text.index("## 8. Fair sharing among tenants")


def test_a_run_alone_records_its_row_keeps_the_other_parts_and_renders_section_7b_again(
    tmp_path: Path,
) -> None:
    record(tmp_path, pickup=[0.001])
    record(
        tmp_path,
        generate=generate_row([level(1, 31, 41, 31), level(8, 155, 105, 51), level(32, 305, 210, 102)]),
    )
    text = (tmp_path / "RESULTS.md").read_text()
    assert text.index(GENERATE_HEADING) < text.index("## 8. Fair sharing")
    raw = json.loads((tmp_path / "results.json").read_text())
    assert raw["pickup"] == [0.001] and raw["generate"]["streampool"]["levels"][2]["concurrency"] == 32

    record(
        tmp_path,
        generate=generate_row([level(1, 20, 41, 31), level(8, 155, 105, 51), level(32, 305, 210, 102)]),
    )
    again = (tmp_path / "RESULTS.md").read_text()
    assert again.count(GENERATE_HEADING) == 1 and len(targets(again.splitlines())) == 4
    assert targets(again.splitlines())[0].endswith("**missed** |")  # 20 / 31 at 1
