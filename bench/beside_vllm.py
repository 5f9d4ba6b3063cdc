"""The rows beside vLLM's own server (RESULTS.md's sections 7 and 7b): each row's client against vLLM's
server and against streampool, one engine alive at a time, and a row run alone (`python -m bench.run
--only-completions` or `--only-generate`: vLLM's server, streampool, vLLM's server again)."""

from __future__ import annotations

import shlex
import sys
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import psutil
import uvloop
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench import generate_client, peer, report, system, vllm_server
from bench.peer import PeerPlan
from bench.peer_figures import PeerRun, SideBySide
from shared.config import Settings
from worker import cpu_placement


async def peer_side(
    side: str, base_url: str, settings: Settings, peer_plan: PeerPlan, logs: Path, progress: Progress
) -> PeerRun:
    task = progress.add_task(f"vLLM's benchmark client, {side}: levels", total=len(peer_plan.levels))
    model, name = settings.model, settings.model_name
    return await peer.run(
        side,
        base_url,
        model,
        name,
        peer_plan,
        logs / "vllm-benchmark-client.log",
        lambda: progress.advance(task),
    )


async def generate_side(
    side: str, base_url: str, settings: Settings, peer_plan: PeerPlan, logs: Path, progress: Progress
) -> PeerRun:
    """`/inference/v1/generate` at the levels of vLLM's benchmark client, by `generate_client`."""
    task = progress.add_task(f"tokens in, tokens out, {side}: levels", total=len(peer_plan.levels))
    return await generate_client.run(
        side, base_url, settings.model, settings.model_name, peer_plan, lambda: progress.advance(task)
    )


Side = Callable[[str, str, Settings, PeerPlan, Path, Progress], Coroutine[Any, Any, PeerRun]]
"""One row's client against one server: `peer_side` or `generate_side`."""


def vllm_side(
    settings: Settings, peer_plan: PeerPlan, logs: Path, progress: Progress, run: int, rows: list[Side]
) -> list[PeerRun]:
    """vLLM's own server, the only engine alive, with this process (its client) on the cores the server
    keeps off its model runner's, as streampool's gateway and Redis are during its turn; each row's
    client in turn against it."""
    port = system.free_port()
    server = vllm_server.start_server(settings, port, logs, f"vllm-server-{run}")
    me, placement = psutil.Process(), None
    try:
        progress.console.print(f"waiting for vLLM's server (run {run})")
        vllm_server.wait_ready(port, server)
        placement = system.share_worker_cores(server, [me])
        url = f"http://127.0.0.1:{port}"

        async def sides() -> list[PeerRun]:
            side = f"vLLM's server, run {run}"
            return [await row(side, url, settings, peer_plan, logs, progress) for row in rows]

        return uvloop.run(sides())
    finally:
        vllm_server.stop(server)
        if placement is not None:
            cpu_placement.bind(me, placement[0])


def side_by_side(
    command: str, quick: bool, peer_plan: PeerPlan, before: PeerRun, streampool: PeerRun, after: PeerRun
) -> SideBySide:
    """One row beside vLLM's server: vLLM's server before streampool and after it, and streampool."""
    mode = "quick" if quick else "full"
    return SideBySide(command, mode, peer_plan.input_len, peer_plan.output_len, [before, after], streampool)


def alone(row: str, peer_plan: PeerPlan, quick: bool, redis_url: str | None) -> None:
    """One row beside vLLM's server alone (`row`: "completions", vLLM's benchmark client, or "generate",
    `/inference/v1/generate`): vLLM's server, streampool, vLLM's server again; its part put into
    results.json (`peer` or `generate`) and RESULTS.md rendered again."""
    side: Side = peer_side if row == "completions" else generate_side
    logs = Path(tempfile.mkdtemp(prefix=f"streampool-bench-{row}-"))
    redis_server, url = (None, redis_url) if redis_url else system.start_redis(logs)
    settings = system.bench_settings(url)
    command = shlex.join(["python", "-m", "bench.run", *sys.argv[1:]])
    children: list[system.Child] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns) as progress:
            [before] = vllm_side(settings, peer_plan, logs, progress, 1, [side])
            progress.console.print("waiting for the gateway and the worker's engine")
            serving, placement = system.start_system(settings, logs, redis_server, children)
            ours = uvloop.run(
                side("streampool", system.base_url(settings), settings, peer_plan, logs, progress)
            )
            children.pop().stop()  # the worker, then the gateway once it has every core again
            if placement is not None:
                for process in serving:
                    cpu_placement.bind(process, placement[0])
            children.pop().stop()
            [after] = vllm_side(settings, peer_plan, logs, progress, 2, [side])
    finally:
        system.tear_down(children, url, settings.key_prefix, redis_server)
    measured = side_by_side(command, quick, peer_plan, before, ours, after)
    path = report.record(**{"peer" if row == "completions" else "generate": measured})
    print(f"wrote the {row} row's part of results.json and rendered {path} (logs: {logs})")
