"""Deleting a key prefix's keys after a test or a benchmark run: neither the gateway nor a worker ever
deletes a whole prefix, so this lives beside the tests (the benchmark imports it from here)."""

from __future__ import annotations

import redis


def delete_prefix(url: str, prefix: str) -> int:
    """Delete every key under `prefix`; answers how many. Synchronous, so that teardowns inside
    another running event loop can call it."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        names = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for start in range(0, len(names), 1000):
            client.delete(*names[start : start + 1000])
    finally:
        client.close()
    return len(names)
