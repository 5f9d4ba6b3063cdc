"""What acknowledging only replicated submissions costs: submit latency (the job store's one round
trip) with `min_replicas_to_ack` 1 against 0, on a private master and replica on this machine.

Submissions alternate between the two settings, so that whatever else the machine does weighs on
both alike; the answer is each one's percentiles and their ratio, from one run.

    python -m bench.replica_ack [--submissions 400]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import tempfile
import time
from pathlib import Path

import redis
import redis.asyncio as aioredis

from bench.stats import percentile
from bench.system import free_port
from shared.config import RedisSettings
from shared.jobstore import JobStore
from shared.keys import Keys
from shared.requests import JobRequest

REQUEST = JobRequest(prompt="The capital of France is", max_tokens=8)


def start_server(folder: Path, *options: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(folder)]
    log = open(folder / f"redis-{port}.log", "wb")  # noqa: SIM115 - lives as long as the server
    process = subprocess.Popen(
        [*command, "--repl-diskless-sync-delay", "0", *options], stdout=log, stderr=log
    )
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            if client.ping():
                return process, port
        except redis.RedisError:
            time.sleep(0.1)
    raise RuntimeError("redis-server did not come up")


async def measure(master_port: int, submissions: int) -> dict[str, dict[str, float]]:
    client = aioredis.Redis(port=master_port, decode_responses=True)
    url = f"redis://127.0.0.1:{master_port}/0"
    stores = {
        replicas: JobStore(
            client, Keys(f"bench-ack-{replicas}"), RedisSettings(redis_url=url, min_replicas_to_ack=replicas)
        )
        for replicas in (0, 1)
    }
    latencies: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(20):  # connections made, scripts loaded
        for store in stores.values():
            await store.submit(REQUEST, model="bench", max_queued=0)
    for n in range(2 * submissions):
        replicas = n % 2
        started = time.perf_counter()
        await stores[replicas].submit(REQUEST, model="bench", max_queued=0)
        latencies[replicas].append((time.perf_counter() - started) * 1000)
    await client.aclose()
    report = {
        f"min_replicas_to_ack={replicas}": {
            "p50_ms": percentile(values, 50),
            "p99_ms": percentile(values, 99),
            "submissions": len(values),
        }
        for replicas, values in latencies.items()
    }
    report["ratio (1 / 0)"] = {
        "p50": percentile(latencies[1], 50) / percentile(latencies[0], 50),
        "p99": percentile(latencies[1], 99) / percentile(latencies[0], 99),
    }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=400, help="of each setting")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        master, port = start_server(Path(folder))
        replica, _ = start_server(Path(folder), "--replicaof", "127.0.0.1", str(port))
        try:
            with redis.Redis(port=port, decode_responses=True) as client:
                while client.info("replication").get("slave0", {}).get("state") != "online":
                    time.sleep(0.1)
            print(json.dumps(asyncio.run(measure(port, args.submissions)), indent=2))
        finally:
            for process in (replica, master):
                process.terminate()
                process.wait()


if __name__ == "__main__":
    main()
