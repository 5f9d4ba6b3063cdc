"""The `streampool` command: each command takes its role's settings as flags, and a flag wins over its
STREAMPOOL_* variable."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from cli import main as cli
from shared.config import GatewaySettings, Settings, WorkerSettings
from shared.requests import JobRequest


def run_cli(monkeypatch: pytest.MonkeyPatch, *argv: str) -> Any:
    """The settings `streampool <argv>` would hand its command, without running the command."""
    seen: list[Any] = []
    command = argv[0]
    monkeypatch.setitem(cli.COMMANDS, command, dataclasses.replace(cli.COMMANDS[command], run=seen.append))
    monkeypatch.setattr(cli, "configure_logging", lambda level: None)  # leave pytest's log handlers alone
    cli.main(list(argv))
    [settings] = seen
    return settings


def help_flags(command: str, capsys: pytest.CaptureFixture[str]) -> set[str]:
    """The flags `streampool <command> --help` lists."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", capsys.readouterr().out))


def test_flags_map_to_settings_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = run_cli(
        monkeypatch,
        "up",
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


def test_each_command_gets_its_roles_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert type(run_cli(monkeypatch, "gateway")) is GatewaySettings
    assert type(run_cli(monkeypatch, "worker")) is WorkerSettings
    assert type(run_cli(monkeypatch, "prepare-model")) is WorkerSettings
    assert type(run_cli(monkeypatch, "up")) is Settings


def test_gateway_help_lists_the_gateways_and_redis_flags_only(capsys: pytest.CaptureFixture[str]) -> None:
    flags = help_flags("gateway", capsys)
    assert {"--redis-url", "--key-prefix", "--port", "--api-keys"} <= flags
    assert not {"--model", "--worker-max-jobs", "--metrics-port"} & flags


def test_worker_help_lists_the_workers_and_redis_flags_only(capsys: pytest.CaptureFixture[str]) -> None:
    flags = help_flags("worker", capsys)
    assert {"--redis-url", "--key-prefix", "--model", "--worker-max-jobs"} <= flags
    assert not {"--port", "--host", "--api-keys", "--max-queued-jobs"} & flags


def test_up_help_lists_every_setting_flag(capsys: pytest.CaptureFixture[str]) -> None:
    expected = {f"--{name.replace('_', '-')}" for name in Settings.model_fields}
    assert expected <= help_flags("up", capsys)


def test_a_flag_wins_over_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMPOOL_PORT", "7000")
    monkeypatch.setenv("STREAMPOOL_KEY_PREFIX", "from-env")
    settings = run_cli(monkeypatch, "gateway", "--port", "9000")
    assert settings.port == 9000
    assert settings.key_prefix == "from-env"  # no flag: the variable still counts


def test_a_role_leaves_the_other_roles_variables_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # `streampool up` hands every setting to both children by environment.
    monkeypatch.setenv("STREAMPOOL_PORT", "7000")
    monkeypatch.setenv("STREAMPOOL_MODEL", "/models/tiny")
    assert run_cli(monkeypatch, "worker").model == Path("/models/tiny")
    assert run_cli(monkeypatch, "gateway").port == 7000


def test_every_command_accepts_the_redis_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    for command in list(cli.COMMANDS):
        assert run_cli(monkeypatch, command, "--key-prefix", "flagged").key_prefix == "flagged"


def test_invalid_flag_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="port"):
        run_cli(monkeypatch, "gateway", "--port", "70000")


def test_another_roles_flag_exits_with_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for argv in (
        ["gateway", "--no-such-setting", "1"],
        ["gateway", "--model", "/m"],
        ["worker", "--port", "1"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            run_cli(monkeypatch, *argv)
        assert exit_info.value.code == 2


def test_submit_options_become_the_jobs_sampling_options() -> None:
    given = cli.job_request(cli.build_parser().parse_args(["submit", "Hi", "--ignore-eos", "--top-k", "5"]))
    assert (given.prompt, given.ignore_eos, given.top_k) == ("Hi", True, 5)
    plain = cli.job_request(cli.build_parser().parse_args(["submit", "Hi"]))
    assert (plain.ignore_eos, plain.top_k) == (False, JobRequest.model_fields["top_k"].default)


def test_list_settings_take_a_repeated_flag_and_a_comma_separated_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = cli.build_parser().parse_args(["worker", "--lora", "a=/x", "--lora", "b=/y"])
    assert cli.settings_from(args, WorkerSettings).adapters == {"a": Path("/x"), "b": Path("/y")}
    monkeypatch.setenv("STREAMPOOL_MODELS", "smol, big")
    gateway = cli.settings_from(cli.build_parser().parse_args(["gateway"]), GatewaySettings)
    assert gateway.models == ["smol", "big"]
