"""`streampool up`: safe by default (without a host asked for, its gateway listens on this machine
only, since it runs without API keys, and says so; a host given by flag or variable is kept), and its
watch over its children on real (tiny) processes (a worker that exits non-zero, its engine dead, is
replaced; the gateway's exit ends the watch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cli.launcher import child_environment, local_settings, reach, supervise
from shared.config import GatewaySettings, Settings
from tests.cli.test_main import run_cli


@pytest.fixture(autouse=True)
def no_host_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMPOOL_HOST", raising=False)
    monkeypatch.delenv("STREAMPOOL_METRICS_HOST", raising=False)


def test_up_runs_its_gateway_and_worker_on_this_machine_only_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served = local_settings(run_cli(monkeypatch, "up"))
    env = child_environment(served)
    assert env["STREAMPOOL_HOST"] == "127.0.0.1"
    assert env["STREAMPOOL_METRICS_HOST"] == "127.0.0.1"
    assert env["STREAMPOOL_ALLOW_UNAUTHENTICATED"] == "true"
    assert reach(served).startswith("this machine only; --host 0.0.0.0 opens it")


def test_a_host_asked_for_by_flag_or_variable_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    by_flag = local_settings(run_cli(monkeypatch, "up", "--host", "0.0.0.0"))
    monkeypatch.setenv("STREAMPOOL_HOST", "0.0.0.0")
    by_variable = local_settings(run_cli(monkeypatch, "up"))
    assert by_flag.host == by_variable.host == "0.0.0.0"
    assert "WITHOUT API keys" in reach(by_flag)
    with_keys = local_settings(Settings(host="0.0.0.0", api_keys="secret"))
    assert reach(with_keys) == "the network, on 0.0.0.0; clients need an API key"


def test_a_gateway_on_its_own_keeps_listening_everywhere() -> None:
    """It refuses to start without keys unless allow_unauthenticated is set: never open by accident."""
    assert GatewaySettings().host == "0.0.0.0"


def python(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def held_gateway() -> subprocess.Popen[bytes]:
    """A gateway that lives until the test closes its stdin, however slowly the machine runs."""
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)


def test_a_worker_that_exits_non_zero_is_replaced_until_the_gateway_exits() -> None:
    gateway = held_gateway()
    started: list[subprocess.Popen[bytes]] = []

    def start_worker() -> subprocess.Popen[bytes]:  # each replacement dies at once too
        started.append(python("raise SystemExit(1)"))
        if len(started) == 2 and gateway.stdin is not None:
            gateway.stdin.close()  # replaced twice: the gateway exits
        return started[-1]

    worker = python("raise SystemExit(1)")
    children = [gateway, worker]
    try:
        assert supervise(gateway, worker, start_worker, children) == 1
        assert gateway.returncode == 0
        assert len(started) >= 2, "the worker was not replaced each time it exited"
        assert children == [gateway, started[-1]]
    finally:
        for child in [gateway, worker, *started]:
            child.kill()
            child.wait()
        assert gateway.stdin is not None
        gateway.stdin.close()


def test_a_worker_that_exits_cleanly_ends_the_watch() -> None:
    gateway = held_gateway()
    worker = python("pass")
    try:
        assert supervise(gateway, worker, lambda: python("pass"), [gateway, worker]) == 1
        assert gateway.poll() is None
    finally:
        gateway.kill()
        gateway.wait()
        assert gateway.stdin is not None
        gateway.stdin.close()
