"""The model card: what a gateway needs to count prompt tokens as the workers will, without torch.

Each model has its own (`ModelKeys.card`): its workers publish it at start-up; gateways read it
(checking its digest first, so the whole card, megabytes of tokenizer, is only read again when it
changed).
"""

from __future__ import annotations

import hashlib

import redis.asyncio as aioredis
from pydantic import BaseModel

from shared.keys import Keys
from shared.pooling import PoolingRoute
from shared.redis_client import redis_errors


class ModelCard(BaseModel):
    """A model's context length, tokenizer and chat template, and how its pool parses output."""

    model: str  # the canonical name
    max_model_len: int
    tokenizer_json: str  # the `tokenizers` serialization of the worker's own tokenizer
    chat_template: str | None
    special_tokens: dict[str, str | list[str]]  # what the chat template sees: bos_token, eos_token, ...
    vocab_size: int | None = None  # the model's own (its embeddings'), which may pass the tokenizer's
    tool_call_parser: str | None = None  # the pool's, when it has auto tool choice: tool_choice needs one
    reasoning_parser: str | None = None
    trust_request_chat_template: bool = False  # a request's own `chat_template` is taken, not refused
    generates: bool = True  # its pool runs generation (vLLM's `generate` task)
    pooling_routes: list[PoolingRoute] = []  # the pooling routes its pool answers, as vLLM's server has them
    # Its engines' prefix cache: how many tokens a block holds (None: no prefix caching), which the
    # gateway hashes a prompt's leading blocks by (`shared.scheduling`).
    cache_block_size: int | None = None

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()


async def publish_model_card(redis: aioredis.Redis, keys: Keys, card: ModelCard) -> None:
    with redis_errors():
        await redis.hset(
            keys.model(card.model).card, mapping={"digest": card.digest, "card": card.model_dump_json()}
        )  # type: ignore[misc]


async def model_card_digest(redis: aioredis.Redis, keys: Keys, model: str) -> str | None:
    """The digest of the model's published card; None when no worker of it has published one."""
    with redis_errors():
        digest: str | None = await redis.hget(keys.model(model).card, "digest")  # type: ignore[misc]
    return digest


async def read_model_card(redis: aioredis.Redis, keys: Keys, model: str) -> ModelCard | None:
    with redis_errors():
        card = await redis.hget(keys.model(model).card, "card")  # type: ignore[misc]
    return None if card is None else ModelCard.model_validate_json(card)
