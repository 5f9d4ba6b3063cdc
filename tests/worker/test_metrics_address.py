"""The worker's /health and /metrics server listens on this machine only unless `metrics_host` says
otherwise (containers set 0.0.0.0, where probes and Prometheus reach it from outside)."""

from __future__ import annotations

import pytest

from cli.engines import start_engine
from shared.config import WorkerSettings
from tests.processes import free_port
from worker.app import WorkerApp


@pytest.mark.parametrize(
    ("options", "address"), [({}, "127.0.0.1"), ({"metrics_host": "0.0.0.0"}, "0.0.0.0")]
)
async def test_the_metrics_server_binds_the_configured_address(
    monkeypatch: pytest.MonkeyPatch, options: dict[str, str], address: str
) -> None:
    monkeypatch.delenv("STREAMPOOL_METRICS_HOST", raising=False)
    server = WorkerApp(WorkerSettings(metrics_port=free_port(), **options), start_engine).server  # type: ignore[arg-type]
    server.start()
    try:
        assert server._httpd is not None
        assert server._httpd.server_address[0] == address
    finally:
        await server.close()
