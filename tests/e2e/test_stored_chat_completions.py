"""OpenAI's stored chat completions through the real `openai` package (`chat.completions.retrieve`,
`list`, `update`, `delete`, `messages.list`), against a gateway and workers on the synthetic engine:
what is stored is the completion as it was answered, listed by the filters and pages OpenAI's API
has. Every test lists under a metadata value of its own: the deployment is shared."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from tests.conftest import System

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Name a colour."},
]


@pytest.fixture(scope="module")
def system(synthetic_system: System) -> System:
    """The subject is what the gateway keeps of a job and reads back, not generation."""
    return synthetic_system


async def _stored(client: openai.AsyncOpenAI, system: System, **metadata: str) -> ChatCompletion:
    return await client.chat.completions.create(
        model=system.settings.model_name, messages=MESSAGES, max_tokens=4, store=True, metadata=metadata
    )


async def test_a_stored_completion_reads_back_as_answered_with_its_messages_and_null_metadata_clears(
    async_openai: openai.AsyncOpenAI, system: System
) -> None:
    run = uuid.uuid4().hex
    created = await _stored(async_openai, system, run=run, topic="colours")
    retrieved = await async_openai.chat.completions.retrieve(created.id)
    assert retrieved.metadata == {"run": run, "topic": "colours"}
    assert retrieved.model_dump(exclude={"metadata"}) == created.model_dump(exclude={"metadata"})
    assert retrieved.choices[0].message.content and retrieved.usage is not None
    messages = await async_openai.chat.completions.messages.list(created.id)
    assert [(m.id, m.role, m.content) for m in messages.data] == [
        (f"{created.id}-0", "system", "Answer briefly."),
        (f"{created.id}-1", "user", "Name a colour."),
    ]
    paged = [m.id async for m in async_openai.chat.completions.messages.list(created.id, limit=1)]
    assert paged == [m.id for m in messages.data]
    newest_first = await async_openai.chat.completions.messages.list(created.id, order="desc", limit=1)
    assert [m.id for m in newest_first.data] == [f"{created.id}-1"] and newest_first.has_more
    cleared = await async_openai.chat.completions.update(created.id, metadata=None)
    assert cleared.metadata == {} == (await async_openai.chat.completions.retrieve(created.id)).metadata


async def test_a_streamed_stored_completion_reads_back_whole(
    async_openai: openai.AsyncOpenAI, system: System
) -> None:
    run = uuid.uuid4().hex
    stream = await async_openai.chat.completions.create(
        model=system.settings.model_name,
        messages=MESSAGES,
        max_tokens=5,
        store=True,
        metadata={"run": run},
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    retrieved = await async_openai.chat.completions.retrieve(chunks[0].id)
    assert retrieved.choices[0].message.content == "".join(
        chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices
    )
    assert retrieved.usage == chunks[-1].usage and retrieved.created == chunks[0].created


async def test_a_completion_not_stored_is_not_found(async_openai: openai.AsyncOpenAI, system: System) -> None:
    answered = await async_openai.chat.completions.create(
        model=system.settings.model_name, messages=MESSAGES, max_tokens=2
    )
    with pytest.raises(openai.NotFoundError):
        await async_openai.chat.completions.retrieve(answered.id)
    with pytest.raises(openai.NotFoundError):
        await async_openai.chat.completions.messages.list(answered.id)


async def test_listing_pages_in_either_order_and_filters_by_model_and_metadata(
    async_openai: openai.AsyncOpenAI, system: System
) -> None:
    run = uuid.uuid4().hex
    ids = [(await _stored(async_openai, system, run=run, n=str(n))).id for n in range(3)]
    await _stored(async_openai, system, run=uuid.uuid4().hex)  # another run's
    completions = async_openai.chat.completions
    first = await completions.list(metadata={"run": run}, limit=2)
    assert [c.id for c in first.data] == ids[:2] and first.has_more
    assert [c.id async for c in completions.list(metadata={"run": run}, limit=2)] == ids
    assert [c.id async for c in completions.list(metadata={"run": run}, order="desc")] == ids[::-1]
    assert [c.id async for c in completions.list(metadata={"run": run}, after=ids[0])] == ids[1:]
    only = await completions.list(metadata={"run": run, "n": "1"})
    assert [(c.id, c.metadata) for c in only.data] == [(ids[1], {"run": run, "n": "1"})]
    assert not only.has_more
    model = system.settings.model_name
    assert [c.id async for c in completions.list(model=model, metadata={"run": run})] == ids
    assert (await completions.list(model=f"{model}-other", metadata={"run": run})).data == []


async def test_update_sets_the_metadata_and_delete_removes_the_completion_and_its_job(
    async_openai: openai.AsyncOpenAI, system: System
) -> None:
    run = uuid.uuid4().hex
    created = await _stored(async_openai, system, run=run, stage="draft")
    updated = await async_openai.chat.completions.update(created.id, metadata={"run": run, "stage": "final"})
    assert updated.id == created.id and updated.metadata == {"run": run, "stage": "final"}
    assert (await async_openai.chat.completions.retrieve(created.id)).metadata == updated.metadata
    final = {"stage": "final", "run": run}
    assert [c.id async for c in async_openai.chat.completions.list(metadata=final)] == [created.id]
    assert (await async_openai.chat.completions.list(metadata={"stage": "draft", "run": run})).data == []
    gone = await async_openai.chat.completions.delete(created.id)
    assert (gone.id, gone.object, gone.deleted) == (created.id, "chat.completion.deleted", True)
    for call in (
        async_openai.chat.completions.retrieve(created.id),
        async_openai.chat.completions.delete(created.id),
        async_openai.chat.completions.messages.list(created.id),
    ):
        with pytest.raises(openai.NotFoundError):
            await call
    assert (await async_openai.chat.completions.list(metadata={"run": run})).data == []
    job_id = created.id.removeprefix("chatcmpl-")
    async with httpx.AsyncClient(base_url=system.base_url) as http:
        assert (await http.get(f"/v1/jobs/{job_id}")).status_code == 404
