"""The `streampool` command: one flag per setting, and a flag wins over its STREAMPOOL_* variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared import cli
from shared.config import Settings


def run_cli(monkeypatch: pytest.MonkeyPatch, *argv: str) -> Settings:
    """The settings `streampool <argv>` would hand its command, without running the command."""
    seen: list[Settings] = []
    command = argv[0]
    monkeypatch.setitem(cli.COMMANDS, command, (seen.append, cli.COMMANDS[command][1]))
    monkeypatch.setattr(cli, "configure_logging", lambda level: None)  # leave pytest's log handlers alone
    cli.main(list(argv))
    [settings] = seen
    return settings


def test_flags_map_to_settings_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = run_cli(
        monkeypatch,
        "gateway",
        "--redis-url",
        "redis://example.invalid:6380/2",
        "--port",
        "9000",
        "--enforce-eager",
        "true",
        "--model",
        "/models/tiny",
        "--max-queued-jobs",
        "7",
        "--poll-wait-max",
        "2.5",
    )
    assert settings.redis_url == "redis://example.invalid:6380/2"
    assert settings.port == 9000
    assert settings.enforce_eager is True
    assert settings.model == Path("/models/tiny")
    assert settings.max_queued_jobs == 7
    assert settings.poll_wait_max == 2.5


def test_a_flag_wins_over_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMPOOL_PORT", "7000")
    monkeypatch.setenv("STREAMPOOL_KEY_PREFIX", "from-env")
    settings = run_cli(monkeypatch, "worker", "--port", "9000")
    assert settings.port == 9000
    assert settings.key_prefix == "from-env"  # no flag: the variable still counts


def test_every_command_accepts_every_setting_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    for command in list(cli.COMMANDS):
        assert run_cli(monkeypatch, command, "--worker-max-jobs", "3").worker_max_jobs == 3


def test_invalid_flag_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="port"):
        run_cli(monkeypatch, "gateway", "--port", "70000")


def test_unknown_flag_exits_with_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_cli(monkeypatch, "gateway", "--no-such-setting", "1")
    assert exit_info.value.code == 2
