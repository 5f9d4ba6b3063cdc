"""The LoRA adapters a worker serves: those given at start (`lora`), and those loaded at run time through
the gateway (`shared.adapters`), which it keeps in step with Redis.

A runtime adapter is loaded into the engine as soon as the worker sees it (at start, each heartbeat, or
when a job names one it does not hold yet). An unloaded one, or one replaced by a load from another
path, is taken out of the engine once the jobs running with it have ended: an unload lets them finish.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import redis.asyncio as aioredis

from shared.adapters import AdapterLoad, RuntimeAdapter, runtime_adapters
from shared.errors import EngineError
from shared.keys import Keys
from worker.engine import ADAPTER_NOT_FOUND, Adapter, Engine

log = logging.getLogger(__name__)


class Adapters:
    """What adapters a worker's jobs may name, and which of them the engine holds."""

    def __init__(
        self, engine: Engine, redis: aioredis.Redis, keys: Keys, model: str, given: Mapping[str, Path]
    ) -> None:
        self.engine = engine
        self.redis = redis
        self.keys = keys
        self.model = model
        self.given = {
            name: Adapter(name, number, str(path))
            for number, (name, path) in enumerate(given.items(), start=1)
        }
        self._numbers = itertools.count(len(self.given) + 1)
        self._loaded: dict[str, tuple[str, Adapter]] = {}  # name -> (its load's id, the adapter)
        self._failed: dict[str, AdapterLoad] = {}  # name -> the load that failed here, and why
        self._running: Counter[int] = Counter()  # jobs running, by adapter number
        self._retired: dict[int, Adapter] = {}  # out of use, taken out of the engine once idle
        self._lock = asyncio.Lock()

    def loads(self) -> dict[str, AdapterLoad]:
        """For the heartbeat: the runtime adapters held, by the load, and the loads that failed."""
        return {
            **self._failed,
            **{name: AdapterLoad(load_id=load_id) for name, (load_id, _) in self._loaded.items()},
        }

    async def sync(self) -> None:
        """Load what Redis holds for this model and this worker does not; retire what it no longer holds."""
        wanted = {
            name: adapter
            for name, adapter in (await runtime_adapters(self.redis, self.keys)).items()
            if adapter.model == self.model and name not in self.given
        }
        async with self._lock:
            for name, spec in wanted.items():
                held = self._loaded.get(name)
                tried = self._failed.get(name)
                if (held is None or held[0] != spec.load_id) and (
                    tried is None or tried.load_id != spec.load_id
                ):
                    await self._load(spec, None if held is None else held[1])
            for name in [name for name in self._loaded if name not in wanted]:
                _, adapter = self._loaded.pop(name)
                log.info("adapter %s unloaded: out of the engine once its running jobs end", name)
                await self._retire(adapter)
            for name in [name for name in self._failed if name not in wanted]:
                del self._failed[name]

    async def _load(self, spec: RuntimeAdapter, held: Adapter | None) -> None:
        in_place = held is not None and spec.load_inplace
        number = held.number if held is not None and in_place else next(self._numbers)
        adapter = Adapter(spec.name, number, spec.path, in_place, spec.is_3d_lora_weight)
        try:
            await self.engine.add_adapter(adapter)
        except EngineError as exc:
            log.warning("adapter %s from %s could not be loaded: %s", spec.name, spec.path, exc.message)
            self._failed[spec.name] = AdapterLoad(
                load_id=spec.load_id, error=exc.message, not_found=exc.detail.get("code") == ADAPTER_NOT_FOUND
            )
            return
        log.info("adapter %s loaded from %s", spec.name, spec.path)
        self._failed.pop(spec.name, None)
        self._loaded[spec.name] = (spec.load_id, adapter)
        if held is not None and not in_place:
            await self._retire(held)

    async def _retire(self, adapter: Adapter) -> None:
        self._retired[adapter.number] = adapter
        if not self._running[adapter.number]:
            await self._remove(adapter)

    async def _remove(self, adapter: Adapter) -> None:
        del self._retired[adapter.number]
        self._running.pop(adapter.number, None)
        await self.engine.remove_adapter(adapter)

    async def _resolve(self, name: str) -> Adapter:
        if name in self.given:
            return self.given[name]
        if name not in self._loaded:
            await self.sync()  # loaded a moment ago, before this worker's next heartbeat
        if name in self._loaded:
            return self._loaded[name][1]
        failed = self._failed.get(name)
        reason = f": {failed.error}" if failed is not None else ""
        raise EngineError(f"this worker does not serve the adapter {name} of {self.model}{reason}")

    @asynccontextmanager
    async def using(self, name: str | None) -> AsyncIterator[Adapter | None]:
        """The adapter a job names (None: the base model), held in the engine while the job runs."""
        if name is None:
            yield None
            return
        adapter = await self._resolve(name)
        self._running[adapter.number] += 1
        try:
            yield adapter
        finally:
            self._running[adapter.number] -= 1
            if adapter.number in self._retired and not self._running[adapter.number]:
                async with self._lock:
                    if adapter.number in self._retired:
                        await self._remove(adapter)
