"""vLLM's own OpenAI server, the peer a user would run instead of streampool, started with the engine
arguments the worker gives its engine (worker.vllm_engine.engine_args) and placed on the cores as the
worker places itself (worker.cpu_placement).

`python -m bench.vllm_server <vLLM's server flags>` runs `vllm.entrypoints.openai.api_server` in its own
process, unchanged, plus one thread: once the server answers /health, it calls the worker's own
`keep_off_model_cores`, which moves the server's process and its engine core off the model runner's
cores, as the worker does for itself once its engine is up.
"""

from __future__ import annotations

import dataclasses
import os
import runpy
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from bench.system import START_TIMEOUT_SECONDS, Child, start
from shared.config import Settings
from worker import cpu_placement

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
PLACEMENT_SECONDS = 10


def server_flags(settings: Settings, port: int) -> list[str]:
    """vLLM's server flags for every engine argument the worker sets away from vLLM's default.

    Built from the worker's own `engine_args`, so the two engines cannot drift apart; it also sets
    VLLM_CPU_KVCACHE_SPACE in this process's environment, which the server inherits.
    """
    from worker.engine_arguments import vllm_serve_defaults  # heavy: imports vllm
    from worker.vllm_engine import engine_args

    args, baseline = engine_args(settings), vllm_serve_defaults()
    # --enable-scale-out: the tokens-in/tokens-out route (`/inference/v1/generate`), 403 without it.
    flags = ["--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log", "--enable-scale-out"]
    for field in dataclasses.fields(args):
        value = getattr(args, field.name)
        if field.name.startswith("_") or value == getattr(baseline, field.name):
            continue
        flag = "--" + field.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, list):
            flags += [flag, *map(str, value)]
        else:
            flags += [flag, str(value)]
    return flags


def start_server(settings: Settings, port: int, log_dir: Path, name: str) -> Child:
    return start(name, ["bench.vllm_server", *server_flags(settings, port)], settings, log_dir)


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_ready(port: int, child: Child) -> None:
    """Until the server answers /health (its engine is up), then a few seconds at most until its process
    is off the model runner's cores (never, where vLLM binds no model runner: on a GPU)."""
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not healthy(port):
        if child.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"vLLM's server did not come up in {START_TIMEOUT_SECONDS} s; see its log")
        time.sleep(0.5)
    everywhere = set(os.sched_getaffinity(0))
    placed_by = time.monotonic() + PLACEMENT_SECONDS
    while set(child.handle.cpu_affinity()) >= everywhere and time.monotonic() < placed_by:
        time.sleep(0.2)


def stop(child: Child) -> None:
    """The server and its engine core: the next engine must not start beside a dying one."""
    engine = child.handle.children(recursive=True)
    child.stop()
    _, alive = psutil.wait_procs(engine, timeout=60)
    for process in alive:
        process.kill()


def _place_when_up(port: int) -> None:
    while not healthy(port):
        time.sleep(0.5)
    cpu_placement.keep_off_model_cores()


if __name__ == "__main__":
    argv = sys.argv[1:]
    threading.Thread(target=_place_when_up, args=(int(argv[argv.index("--port") + 1]),), daemon=True).start()
    sys.argv = [SERVER_MODULE, *argv]
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)
