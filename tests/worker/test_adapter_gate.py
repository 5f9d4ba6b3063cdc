"""The adapter gate: requests of one adapter (or of the base model) run together, never beside
another group's, and a group that waits gets its turn before the running group takes more."""

from __future__ import annotations

import asyncio
import contextlib

from tests.helpers import eventually
from worker.adapter_gate import AdapterGate


class Requests:
    """Requests holding the gate until released, with what ran when."""

    def __init__(self, gate: AdapterGate) -> None:
        self.gate = gate
        self.inside: list[str] = []
        self.order: list[str] = []
        self.release: dict[str, asyncio.Event] = {}

    def start(self, name: str, group: str | None) -> asyncio.Task[None]:
        self.release[name] = asyncio.Event()
        return asyncio.create_task(self._run(name, group))

    async def _run(self, name: str, group: str | None) -> None:
        async with self.gate.hold(group):
            self.inside.append(name)
            self.order.append(name)
            await self.release[name].wait()
            self.inside.remove(name)

    async def running(self, *names: str) -> None:
        async def inside() -> list[str]:
            await asyncio.sleep(0)
            return sorted(self.inside)

        await eventually(inside, f"{names} inside", 5, 0.01, until=lambda now: now == sorted(names))


async def test_one_group_runs_at_a_time_and_a_waiting_group_goes_next() -> None:
    requests = Requests(AdapterGate())
    tasks = [requests.start("base-1", None), requests.start("base-2", None)]
    await requests.running("base-1", "base-2")  # one group runs together
    tasks.append(requests.start("pirate-1", "pirate"))
    await asyncio.sleep(0.05)
    tasks.append(requests.start("base-3", None))  # the base model's turn is not taken again yet
    await asyncio.sleep(0.05)
    assert sorted(requests.inside) == ["base-1", "base-2"]

    requests.release["base-1"].set()
    requests.release["base-2"].set()
    await requests.running("pirate-1")
    requests.release["pirate-1"].set()
    await requests.running("base-3")
    requests.release["base-3"].set()
    await asyncio.gather(*tasks)
    assert requests.order == ["base-1", "base-2", "pirate-1", "base-3"]


async def test_a_cancelled_wait_leaves_the_gate_to_the_others() -> None:
    requests = Requests(AdapterGate())
    base = requests.start("base", None)
    await requests.running("base")
    given_up = requests.start("poet", "poet")
    await asyncio.sleep(0.05)
    given_up.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await given_up
    more = requests.start("base-2", None)  # nobody else waits: it joins the running group
    await requests.running("base", "base-2")
    for name in ("base", "base-2"):
        requests.release[name].set()
    await asyncio.gather(base, more)
