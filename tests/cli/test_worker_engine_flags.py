"""`streampool worker [MODEL] [vLLM engine flags]`: the flags reach the worker's settings; a flag vLLM's
parser refuses ends the start with its message and a usage error's status, not a traceback."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from cli import main as cli
from cli.launcher import child_environment
from shared.config import Settings, WorkerSettings


@pytest.fixture(scope="module", autouse=True)
def engine_parser() -> None:
    """The worker's command reads engine flags with vLLM's parser: imported here, by the test process
    that runs this module (tests/schedule.py's `engine-libraries`), not by every one as it collects;
    its import raises torch's deprecation warnings, which pytest would turn into failures."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import worker.engine_arguments  # noqa: F401


def worker_settings(monkeypatch: pytest.MonkeyPatch, *argv: str) -> Any:
    """The settings `streampool worker <argv>` hands its command, without running the command."""
    seen: list[Any] = []
    monkeypatch.setitem(cli.COMMANDS, "worker", dataclasses.replace(cli.COMMANDS["worker"], run=seen.append))
    monkeypatch.setattr(cli, "configure_logging", lambda level: None)  # leave pytest's log handlers alone
    cli.main(["worker", *argv])
    [settings] = seen
    return settings


def test_the_model_and_engine_flags_go_to_the_engine_beside_the_workers_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STREAMPOOL_ENGINE_ARGS", "--seed 4")
    settings = worker_settings(
        monkeypatch, "/models/tiny", "--enforce-eager", "--worker-max-jobs", "9", "-tp", "1", "--lora", "a=/x"
    )
    assert settings.engine_args == ["/models/tiny", "--seed", "4", "--enforce-eager", "-tp", "1"]
    assert (settings.worker_max_jobs, settings.lora) == (9, ["a=/x"])
    # The flags under a setting's name set it, as the worker announces what its engine runs.
    assert (settings.model, settings.enforce_eager) == (Path("/models/tiny"), True)


def test_other_commands_still_refuse_flags_they_do_not_know(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(cli.COMMANDS, "gateway", dataclasses.replace(cli.COMMANDS["gateway"], run=print))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["gateway", "--max-num-seqs", "8"])
    assert exit_info.value.code == 2


def test_an_unknown_engine_flag_ends_the_start_with_vllms_message() -> None:
    streampool = Path(sys.executable).parent / "streampool"
    done = subprocess.run(
        [str(streampool), "worker", "--max-num-seqs", "8", "--no-such-flag"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "streampool worker: error: unrecognized arguments: --no-such-flag" in done.stderr
    assert "Traceback" not in done.stderr


def test_up_hands_its_worker_the_engine_flags_whole_and_no_default_to_contradict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("STREAMPOOL_MAX_MODEL_LEN", raising=False)
    flags = ["--override-generation-config", '{"top_k": 3, "top_p": 0.9}']
    env = child_environment(Settings(engine_args=flags))
    monkeypatch.setenv("STREAMPOOL_ENGINE_ARGS", env["STREAMPOOL_ENGINE_ARGS"])
    assert WorkerSettings().engine_args == flags
    assert "STREAMPOOL_MAX_MODEL_LEN" not in env  # the worker's `--max-model-len` flag may set it
    assert child_environment(Settings(max_model_len=512))["STREAMPOOL_MAX_MODEL_LEN"] == "512"


def test_the_workers_help_lists_vllms_engine_flags_after_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["worker", "--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    own, engine = shown.split("vLLM's engine flags, as `vllm serve` takes them (after MODEL")
    assert "--worker-max-jobs" in own and "--tensor-parallel-size" not in own
    assert "--tensor-parallel-size" in engine and "--max-num-batched-tokens" in engine
