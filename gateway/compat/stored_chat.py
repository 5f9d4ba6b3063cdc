"""OpenAI's stored chat completions (`store: true`): what a stored completion's job keeps beside it, and
the objects the stored completions routes answer with. Pure, no I/O.

A stored chat completion is its job, with no second copy of its request or answer: its job keeps its
`metadata` in its annotations (`METADATA`, which only a stored completion's job has), and its answer is
made again from its events (`gateway.stored_completions`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from gateway.compat.openai_bodies import MAX_METADATA, ChatBody, CompletionBody, Metadata
from shared.chat import ChatMessage
from shared.errors import InvalidRequest

COMPLETION_PREFIX = "chatcmpl-"
METADATA = "chat_metadata"
"""The annotation of a stored chat completion's job: its metadata (a JSON object)."""
METADATA_FILTER = re.compile(r"metadata\[(.*)\]")
"""A listing's filter on one metadata key, as OpenAI's client sends it: `metadata[key]=value`."""
METADATA_BOUNDS: TypeAdapter[dict[str, str]] = TypeAdapter(Metadata)


def stored_annotations(body: ChatBody | CompletionBody) -> dict[str, str]:
    """What a chat completion's job keeps beside it to be stored: its metadata; nothing unless
    `store` is true (on a completion, nothing)."""
    if not isinstance(body, ChatBody) or not body.store:
        return {}
    return {METADATA: json.dumps(body.metadata or {})}


def metadata_of(annotations: Mapping[str, str]) -> dict[str, str] | None:
    """A stored completion's metadata, from its job's annotations; None for a job not stored."""
    kept = annotations.get(METADATA)
    return None if kept is None else dict(json.loads(kept))


class MetadataUpdate(BaseModel):
    """`POST /v1/chat/completions/{id}`: as on OpenAI, only the metadata can change (null clears it)."""

    model_config = ConfigDict(extra="forbid")

    metadata: Metadata | None

    def annotations(self) -> dict[str, str]:
        return {METADATA: json.dumps(self.metadata or {})}


def metadata_filter(query: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The `metadata[key]=value` filters of a listing's query: a completion is listed when its metadata
    holds every one. 400 past OpenAI's bounds of metadata, so that a filter costs what metadata does."""
    wanted = {found[1]: value for name, value in query if (found := METADATA_FILTER.fullmatch(name))}
    try:
        METADATA_BOUNDS.validate_python(wanted)
    except ValidationError as exc:
        raise InvalidRequest(
            f"metadata: at most {MAX_METADATA} filters, keys of 64 characters, values of 512",
            param="metadata",
            code="invalid_value",
        ) from exc
    return wanted


def listed(
    metadata: Mapping[str, str], model: str, *, of_model: str | None, wanted: Mapping[str, str]
) -> bool:
    """Whether a stored completion of `model` (as its request named it) with `metadata` passes a
    listing's filters: `of_model` (None: any), and the metadata `wanted`."""
    same_model = of_model is None or model == of_model
    return same_model and all(metadata.get(key) == value for key, value in wanted.items())


def store_messages(completion_id: str, messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The request's messages as OpenAI's `ChatCompletionStoreMessage`s, each with an id of its own
    (the completion's id and its place); content parts were joined into the content the job keeps."""
    return [
        {
            "id": f"{completion_id}-{n}",
            **message.model_dump(exclude_none=True),
            "content": message.content,
            "content_parts": None,
        }
        for n, message in enumerate(messages)
    ]


def deleted(completion_id: str) -> dict[str, Any]:
    return {"id": completion_id, "object": "chat.completion.deleted", "deleted": True}
