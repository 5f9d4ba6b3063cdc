"""`python -m bench.probe_worker COUNTERS`: the product's worker (worker.app.build_worker, unchanged),
plus a task that writes its publisher's `round_trips` counter to a file, so that the bench can
measure Redis round trips per engine step directly instead of inferring them."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from shared.config import Settings
from shared.logs import configure_logging
from worker.app import build_worker

DUMP_SECONDS = 0.05


async def _dump(ctx: dict[str, Any], path: Path) -> None:
    publisher = ctx["runner"].publisher
    scratch = path.with_suffix(".tmp")
    while True:
        scratch.write_text(json.dumps({"round_trips": publisher.round_trips}))
        scratch.replace(path)  # atomic: the bench never reads half a file
        await asyncio.sleep(DUMP_SECONDS)


def read_round_trips(path: Path) -> int:
    return int(json.loads(path.read_text())["round_trips"])


def main() -> None:
    counters = Path(sys.argv[1])
    settings = Settings()
    configure_logging(settings.log_level)
    worker = build_worker(settings)
    startup = worker.on_startup

    async def startup_and_dump(ctx: dict[str, Any]) -> None:
        if startup is not None:
            await startup(ctx)
        ctx["bench_dump"] = asyncio.create_task(_dump(ctx, counters))

    worker.on_startup = startup_and_dump
    worker.run()


if __name__ == "__main__":
    main()
