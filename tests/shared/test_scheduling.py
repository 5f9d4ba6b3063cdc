"""The prompt's block hashes the queue places jobs by are vLLM's own prefix-cache keys: the same
function of the same tokens, from the same seed, as vLLM's scheduler computes them."""

from __future__ import annotations

import warnings

from shared.scheduling import HASH_CHARACTERS, block_hashes


def vllm_block_hashes(token_ids: list[int], block_size: int) -> list[str]:
    with warnings.catch_warnings():  # importing vLLM raises torch's deprecation warnings
        warnings.simplefilter("ignore", DeprecationWarning)
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash
    init_none_hash(sha256)  # as vLLM's engine core does at start, with its default algorithm
    hashes: list[str] = []
    parent = None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(sha256, parent, token_ids[start : start + block_size])
        hashes.append(parent.hex()[:HASH_CHARACTERS])
    return hashes


def test_block_hashes_are_vllms() -> None:
    token_ids = [(7 * i) % 49152 for i in range(16 * 5 + 3)]
    ours = block_hashes(token_ids, 16)
    assert len(ours) == 5  # full blocks only: the last 3 tokens are no block of the cache
    assert ours == vllm_block_hashes(token_ids, 16)


def test_a_block_hash_covers_every_block_before_it() -> None:
    shared = list(range(64))
    one, other = block_hashes(shared + [1] * 16, 16), block_hashes(shared + [2] * 16, 16)
    assert one[:4] == other[:4] and one[4] != other[4]
    assert block_hashes([5] * 16 + shared, 16)[1:] != block_hashes(shared, 16)[:4]  # same tokens, later
    assert block_hashes(shared, 16, adapter="sql") != block_hashes(shared, 16)
