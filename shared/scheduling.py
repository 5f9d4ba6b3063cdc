"""What the queue knows of a job's prompt to place it: its tokens, which count against its tenant's
share (`claim.lua`), and the hashes of its leading blocks, which find the worker whose prefix cache
holds them (`submit.lua`, `advertise.lua`).

The hashes are vLLM's own (`vllm.v1.core.kv_cache_utils.hash_block_tokens` with its default
`sha256`, from its fixed `NONE_HASH` seed), computed without importing vLLM, so that the gateway,
which has no vLLM, and the worker agree with each other and with the engine's cache: the hash of a
full block of `block_size` tokens covers every block before it. A test holds them to vLLM's.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from dataclasses import dataclass

NONE_HASH_SEED = "vllm-none-hash"  # vLLM's `DEFAULT_NONE_HASH_SEED`, where PYTHONHASHSEED is unset
MAX_PREFIX_BLOCKS = 256
"""The most leading blocks of a prompt hashed: past them, a longer shared prefix changes no choice."""
HASH_CHARACTERS = 16
"""How much of each hash (hex) the queue keeps: 64 bits, ample to tell a model's blocks apart."""


def _sha256(value: object) -> bytes:
    """vLLM's `sha256`: the pickle of `value` (highest protocol), hashed."""
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


NONE_HASH = _sha256(NONE_HASH_SEED)


def block_hashes(
    token_ids: Sequence[int], block_size: int, adapter: str | None = None, limit: int = MAX_PREFIX_BLOCKS
) -> list[str]:
    """The hashes of the full blocks that start `token_ids`, at most `limit`, as vLLM's prefix cache
    keys them, each kept as its first `HASH_CHARACTERS` hex digits. An adapter's blocks are another
    adapter's or the base model's never: its name is part of each key (vLLM's `extra_keys` also name
    its path, which only the worker knows, so these are ours alone)."""
    extra_keys = (("lora", adapter),) if adapter else None
    hashes: list[str] = []
    parent = NONE_HASH
    for start in range(0, min(len(token_ids) // block_size, limit) * block_size, block_size):
        parent = _sha256((parent, tuple(token_ids[start : start + block_size]), extra_keys))
        hashes.append(parent.hex()[:HASH_CHARACTERS])
    return hashes


@dataclass(frozen=True)
class Placement:
    """A prompt as the queue places it: its tokens (None where they are not counted: the share then
    counts the job as one) and its leading blocks' hashes (none where its model's cache block size
    is not known)."""

    prompt_tokens: int | None = None
    prefix_blocks: tuple[str, ...] = ()


NO_PLACEMENT = Placement()
"""A job the queue knows nothing of: counted as one job, placed by no prefix."""
