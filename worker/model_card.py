"""The model card a worker publishes at start-up, so that gateways can refuse too-long prompts early.

Each engine gives its own (`Engine.model_card`); vLLM's is built here from the same folder, with the
same tokenizer class, that vLLM loads: the gateway's count then equals the worker's. The worker
still checks every prompt itself; a card it cannot build only means gateways leave that check to
the worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import redis.asyncio as aioredis

from shared.config import WorkerSettings
from shared.keys import Keys
from shared.model_card import ModelCard, publish_model_card
from worker.engine import Engine

log = logging.getLogger(__name__)


def build_model_card(folder: Path, model: str, max_model_len: int) -> ModelCard | None:
    """The card of the model in `folder`; None when its tokenizer has no `tokenizers` form."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    template = tokenizer.chat_template
    return ModelCard(
        model=model,
        max_model_len=max_model_len,
        tokenizer_json=backend.to_str(),
        chat_template=template if isinstance(template, str) else None,
        special_tokens=dict(tokenizer.special_tokens_map),
        vocab_size=_vocab_size(folder),
    )


def _vocab_size(folder: Path) -> int | None:
    """The model's vocabulary as its config gives it (None without one): ids past the tokenizer's
    may still be the model's, and vLLM takes them in a prompt."""
    try:
        size = json.loads((folder / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError):
        return None
    return size if isinstance(size, int) else None


async def build_card(folder: Path, model: str, max_model_len: int) -> ModelCard | None:
    """The card, built off the event loop; None when there is none, which is logged, never fatal."""
    try:
        card = await asyncio.to_thread(build_model_card, folder, model, max_model_len)
    except Exception:
        log.exception("no model card: gateways will not check prompt lengths")
        return None
    if card is None:
        log.warning("no model card (no tokenizer.json form): gateways will not check prompt lengths")
    return card


async def engine_card(settings: WorkerSettings, engine: Engine) -> ModelCard | None:
    """The card to publish: the engine's own, with what the pool's parsers take and what its model
    serves (generation, pooling routes), so that gateways refuse what it cannot (vLLM's start-up flags)."""
    card = await engine.model_card()
    if card is None:
        return None
    serving = await engine.serving()
    return card.model_copy(
        update={
            "generates": serving.generates,
            "pooling_routes": serving.pooling_routes,
            "chat_template": engine.chat_template,
            "tool_call_parser": settings.auto_tool_parser,
            "reasoning_parser": settings.reasoning_parser,
            "trust_request_chat_template": settings.trust_request_chat_template,
            # The gateway hashes prompts by it, for the jobs to find the worker holding their prefix.
            "cache_block_size": engine.prefix_cache.block_size
            if engine.prefix_cache and settings.prefix_aware_claiming
            else None,
        }
    )


async def publish(redis: aioredis.Redis, keys: Keys, card: ModelCard) -> None:
    await publish_model_card(redis, keys, card)
    log.info("model card published: %s, context %d", card.model, card.max_model_len)
