"""The models a key prefix knows, and how the name a request gives resolves to one of them.

A worker serves one model. It may go by several names (vLLM's `--served-model-name` takes
several): the first is the model's canonical name, which names its queue (`Keys.model`), the
others are aliases. It may also serve LoRA adapters of that model, which a request names as
`<model>:<adapter>` or by the adapter's own name; their jobs go to the base model's queue.

Adapters loaded at run time (`shared.adapters`) count as their model's from the moment they are
loaded until they are unloaded, whatever the workers say.

Every heartbeat writes its model's entry to the registry (`Keys.models`), so a model stays known
once its last worker has gone: its jobs then queue until a worker of it starts, which is what an
autoscaler that scales a model from zero needs. A gateway may also declare models (its `models`
setting) before any worker of them ever ran. A name that is neither is unknown: 404.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import redis.asyncio as aioredis
from pydantic import BaseModel

from shared.adapters import RuntimeAdapter
from shared.errors import BackendUnavailable, ModelNotFound, ModelRequired
from shared.keys import Keys
from shared.redis_client import redis_errors

ADAPTER_SEPARATOR = ":"


class ModelEntry(BaseModel):
    """What the registry remembers of one model, as its workers last announced it."""

    name: str
    aliases: list[str] = []
    adapters: list[str] = []
    adapter_paths: dict[str, str] = {}  # where each adapter was loaded from (vLLM's `root` of it)
    max_model_len: int | None = None
    max_chars_per_token: int | None = None  # its tokenizer's longest token, in characters
    last_seen: float | None = None  # epoch seconds of the last heartbeat of a worker of it

    def merged(self, other: ModelEntry) -> ModelEntry:
        """This entry with another one's news: workers of one model may serve different adapters."""
        newer = other if (other.last_seen or 0) >= (self.last_seen or 0) else self
        return ModelEntry(
            name=self.name,
            aliases=list(dict.fromkeys([*self.aliases, *other.aliases])),
            adapters=list(dict.fromkeys([*self.adapters, *other.adapters])),
            adapter_paths={**self.adapter_paths, **other.adapter_paths},
            max_model_len=newer.max_model_len or self.max_model_len or other.max_model_len,
            max_chars_per_token=newer.max_chars_per_token
            or self.max_chars_per_token
            or other.max_chars_per_token,
            last_seen=newer.last_seen,
        )


@dataclass(frozen=True)
class Target:
    """Where a job goes: its model's canonical name (its queue), and the adapter it runs with, if any."""

    model: str
    adapter: str | None = None

    @property
    def qualified(self) -> str:
        """The name a job carries to its worker: `<model>:<adapter>`, or the model's name."""
        return self.model if self.adapter is None else f"{self.model}{ADAPTER_SEPARATOR}{self.adapter}"

    @classmethod
    def of_job(cls, qualified: str | None, model: str) -> Target:
        """The target of a job a worker of `model` took, from the name the job carries."""
        prefix = model + ADAPTER_SEPARATOR
        if qualified is not None and qualified.startswith(prefix):
            return cls(model, qualified[len(prefix) :])
        return cls(model)


async def read_registry(redis: aioredis.Redis, keys: Keys) -> list[ModelEntry]:
    """Every model the workers have announced on this prefix, and an entry for each adapter loaded at
    run time (its model's name, the adapter and its path), in one round trip."""
    with redis_errors():
        async with redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(keys.models)
            pipe.hgetall(keys.runtime_adapters)
            announced, loaded = await pipe.execute()
    runtime = [RuntimeAdapter.model_validate_json(value) for value in loaded.values()]
    return [
        *(ModelEntry.model_validate_json(value) for _, value in sorted(announced.items())),
        *(
            ModelEntry(
                name=adapter.model, adapters=[adapter.name], adapter_paths={adapter.name: adapter.path}
            )
            for adapter in sorted(runtime, key=lambda adapter: adapter.name)
        ),
    ]


async def queue_depths(redis: aioredis.Redis, keys: Keys, models: Iterable[str]) -> dict[str, int]:
    """How many jobs wait in each model's queue, in one round trip."""
    names = list(models)
    with redis_errors():
        async with redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.zcard(keys.model(name).queue)
            depths = await pipe.execute()
    return {name: int(depth) for name, depth in zip(names, depths, strict=True)}


class Catalog:
    """The models one gateway knows at one moment: the registry's and its own declared ones.

    Names resolve in this order: a canonical name, an alias, an adapter's own name, then
    `<name>:<adapter>` for a name of the first two kinds and an adapter of its model.
    """

    def __init__(
        self, entries: Iterable[ModelEntry], declared: Iterable[str] = (), live: Iterable[ModelEntry] = ()
    ) -> None:
        """`entries`: the registry's; `declared`: the gateway's own names; `live`: the entry of each live
        worker (one per worker), whose names and adapters count at once, before the registry has them."""
        self.entries: dict[str, ModelEntry] = {}
        live = list(live)
        for entry in [*entries, *live]:
            known = self.entries.get(entry.name)
            self.entries[entry.name] = entry if known is None else known.merged(entry)
        self.workers = Counter(entry.name for entry in live)
        """Live workers per model."""
        for name in declared:
            self.entries.setdefault(name, ModelEntry(name=name))
        names: dict[str, Target] = {}
        for entry in self.entries.values():
            for adapter in entry.adapters:
                names.setdefault(adapter, Target(entry.name, adapter))
        for entry in self.entries.values():
            names.update({alias: Target(entry.name) for alias in entry.aliases})
        names.update({name: Target(name) for name in self.entries})
        self.names = names

    def resolve(self, requested: str | None, default: str | None = None) -> Target:
        """The target of the model a request names (`default` when it names none).

        `BackendUnavailable` while no model is known at all (nothing could ever run the job);
        `ModelRequired` for a request that names none where several are known and no default is set;
        `ModelNotFound` for a name that is no model's, alias's or adapter's.
        """
        if not self.entries:
            raise BackendUnavailable(
                "no model is known yet: no worker has announced one and the gateway declares none (`models`)"
            )
        requested = requested if requested is not None else default
        if requested is None:
            if len(self.entries) == 1:
                return Target(next(iter(self.entries)))
            raise ModelRequired(
                f"model: this gateway serves several models ({self.listed()}); name one", param="model"
            )
        if (target := self.names.get(requested)) is not None:
            return target
        base, separator, adapter = requested.rpartition(ADAPTER_SEPARATOR)
        target = self.names.get(base) if separator else None
        if target is not None and target.adapter is None and adapter in self.entries[target.model].adapters:
            return Target(target.model, adapter)
        raise ModelNotFound(f"The model `{requested}` does not exist; known: {self.listed()}", param="model")

    def listed(self) -> str:
        return ", ".join(sorted(self.names)) or "none"
