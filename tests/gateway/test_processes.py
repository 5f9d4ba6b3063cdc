"""`processes` > 1: several gateway processes accept on one port, each a whole gateway, and a stop
signal to the command reaches them all."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx
import psutil
import pytest

from tests.gateway.keyed_gateway import run_gateway
from tests.helpers import eventually

PROCESSES = 2
CONNECTIONS_MOST = 200


def _serving(parent: psutil.Process, port: int) -> dict[int, int]:
    """Per gateway process (the command's children), how many client connections to `port` it holds."""
    return {
        child.pid: sum(1 for c in child.net_connections("tcp") if c.laddr.port == port and c.raddr)
        for child in parent.children()
    }


async def test_several_processes_share_the_port_and_all_stop_on_the_commands_signal(
    redis_url: str, tmp_path: Path
) -> None:
    gateways = run_gateway(redis_url, tmp_path, allow_unauthenticated=True, processes=PROCESSES)
    gateway = next(gateways)
    try:
        parent = psutil.Process(gateway.pid)
        assert len(parent.children()) == PROCESSES
        clients: list[httpx.AsyncClient] = []
        try:
            # Each client keeps its connection open; a missing job is read from Redis by whichever
            # process accepted the connection. The processes race to accept on the one socket, and
            # a burst of connections may all go to one of them: they come one at a time, until every
            # process holds one.
            held: dict[int, int] = {}
            while len(clients) < CONNECTIONS_MOST and not (held and all(held.values())):
                clients.append(httpx.AsyncClient(base_url=gateway.base_url))
                assert (await clients[-1].get(f"/v1/jobs/{'0' * 32}")).status_code == 404
                held = _serving(parent, gateway.settings.port)
            assert sum(held.values()) == len(clients) and all(held.values()), held  # every process serves
        finally:
            for client in clients:
                await client.aclose()
        children = parent.children()
        os.kill(gateway.pid, signal.SIGTERM)
        assert await asyncio.to_thread(parent.wait, 30) == 0
        await eventually(
            lambda: asyncio.sleep(0, not any(child.is_running() for child in children)), "every process ended"
        )
    finally:
        with pytest.raises(StopIteration):
            next(gateways)
