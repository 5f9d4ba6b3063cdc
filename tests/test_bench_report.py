"""bench/RESULTS.md is rendered whole from bench/results.json: the committed report is what its figures
render to, and a report recorded again from the figures it was rendered from is the same text."""

from __future__ import annotations

from pathlib import Path

from bench.report import HERE, RESULTS_MD, load, record, render, save


def test_the_committed_report_is_what_the_committed_figures_render_to() -> None:
    assert "\n".join(render(load(HERE))) + "\n" == (HERE / RESULTS_MD).read_text()


def test_figures_saved_and_loaded_again_are_the_same_and_render_the_same_text(tmp_path: Path) -> None:
    figures = load(HERE)
    first = save(figures, tmp_path).read_text()
    assert load(tmp_path) == figures
    assert record(tmp_path).read_text() == first
