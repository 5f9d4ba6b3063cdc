"""OpenAI's Files and Batch APIs through the real `openai` package, against gateway processes and a
worker on the synthetic engine of the module's own (keys of two owners, short leases): the subject is
what the gateways do with files and batches (their storage, their lifecycle, their crashes), not
generation; a batch on the real engine is in test_openai_client.py.

A batch's line n runs as the job `line_job_id(batch, n)`: what ran is read from those records and from
the tenant's totals, which count every job's end once. A third key's keys-file entry gives it a
webhook secret and a default webhook, a receiver on loopback: its batches' ends are announced there.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
import pytest
import redis
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from openai.types.webhooks import (
    BatchCancelledWebhookEvent,
    BatchCompletedWebhookEvent,
    BatchExpiredWebhookEvent,
    BatchFailedWebhookEvent,
)

from cli.launcher import wait_healthy
from gateway.batch_driver import derived_file_id
from shared.batches import line_job_id
from shared.config import Settings
from shared.keys import Keys
from tests.conftest import SYSTEM_START_TIMEOUT, make_settings
from tests.gateway.webhooks.receiver import Delivery, Receiver, new_secret, receiving
from tests.helpers import eventually_sync
from tests.processes import Processes, free_port
from tests.redis_cleanup import delete_prefix
from tests.scripted_pool import ARGUMENTS, REASONING, SCRIPTED_POOL

MODEL = "smol"
KEYS = ("key-a", "key-b")
HOOKED_KEY = "key-hooked"
ENDED = {"completed", "failed", "expired", "cancelled"}
BATCH_DEADLINE_SECONDS = 90.0


@dataclass
class Deployment:
    """Gateways (by name) and one synthetic worker on one Redis prefix, and what they share."""

    settings: Settings
    processes: Processes
    gateways: dict[str, str]
    redis: redis.Redis
    clients: list[openai.OpenAI]

    def start_gateway(self, name: str, **overrides: Any) -> str:
        settings = self.settings.model_copy(update={"port": free_port(), **overrides})
        process = self.processes.start(name, "gateway", settings)
        base_url = f"http://127.0.0.1:{settings.port}"
        assert wait_healthy(base_url, [process], 1, SYSTEM_START_TIMEOUT), f"logs in {self.processes.log_dir}"
        self.gateways[name] = base_url
        return base_url

    def client(self, name: str = "a", key: str = KEYS[0]) -> openai.OpenAI:
        # No retries: a failure must show as it happened, not as the third attempt.
        made = openai.OpenAI(base_url=f"{self.gateways[name]}/v1", api_key=key, max_retries=0, timeout=60)
        self.clients.append(made)
        return made

    def holder(self, batch_id: str) -> str | None:
        """The name of the gateway process driving the batch now, by the pid its lease names."""
        lease = self.redis.get(f"{self.settings.key_prefix}:batch:{batch_id}:lease")
        if not lease:
            return None
        pid = int(str(lease).split("-")[-2])
        return next((name for name, child in self.processes.children.items() if child.pid == pid), None)

    def field(self, batch_id: str, name: str) -> str | None:
        value = self.redis.hget(f"{self.settings.key_prefix}:batch:{batch_id}", name)
        return str(value) if value is not None else None

    def jobs_ended(self, tenant: str) -> int:
        """Every job of the tenant that ever ended, each counted once by the script that ended it."""
        return int(self.redis.hget(f"{self.settings.key_prefix}:tenants:totals", f"{tenant}:jobs") or 0)


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    """The webhook receiver of `HOOKED_KEY`'s batches."""
    with receiving(new_secret()) as receiver:
        yield receiver


@contextlib.contextmanager
def deployed(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, keys_file: str, **overrides: Any
) -> Iterator[Deployment]:
    """Two gateways and a synthetic worker serving `smol` at 100 steps a second, each answer as long as
    its `max_tokens`; batches' leases of two seconds, so that a takeover comes soon; `overrides` of
    those settings."""
    logs = tmp_path_factory.mktemp("batch-logs")
    keys_path = tmp_path_factory.mktemp("batch-keys") / "keys.toml"
    keys_path.write_text(keys_file)
    settings = make_settings(
        redis_url,
        host="127.0.0.1",
        api_keys=",".join(KEYS),
        api_keys_file=keys_path,
        engine="synthetic",
        served_model_name=MODEL,
        default_model=MODEL,
        synthetic_step_seconds=0.01,
        synthetic_mean_tokens=0,
        worker_poll_delay=0.05,
        files_dir=tmp_path_factory.mktemp("files"),
        batch_lease_seconds=2.0,
        metrics_port=free_port(),
        **overrides,
    )
    processes = Processes(logs)
    batches = Deployment(settings, processes, {}, redis.Redis.from_url(redis_url, decode_responses=True), [])
    try:
        processes.start("worker", "worker", settings)
        batches.start_gateway("a")
        batches.start_gateway("b")
        yield batches
    finally:
        for client in batches.clients:
            client.close()
        batches.redis.close()
        processes.stop_all()
        delete_prefix(redis_url, settings.key_prefix)


@pytest.fixture(scope="module")
def batches(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, receiver: Receiver
) -> Iterator[Deployment]:
    """The module's deployment; `HOOKED_KEY`'s batches' ends are announced to `receiver`."""
    keys_file = (
        f'[[keys]]\nkey = "{HOOKED_KEY}"\nwebhook_secret = "{receiver.secret}"\n'
        f'webhook_url = "{receiver.url}"\n'
    )
    with deployed(
        redis_url, tmp_path_factory, keys_file, webhook_allowed_prefixes=[receiver.url]
    ) as deployment:
        yield deployment


def request_line(custom_id: str, max_tokens: int = 4, **overrides: Any) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"say {custom_id}"}],
        "max_tokens": max_tokens,
    }
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": body,
        **overrides,
    }


def upload(client: openai.OpenAI, lines: list[dict[str, Any]]) -> str:
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return client.files.create(file=("input.jsonl", data), purpose="batch").id


def response_line(custom_id: str) -> dict[str, Any]:
    body = {"model": MODEL, "input": f"say {custom_id}", "max_output_tokens": 4}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/responses", "body": body}


def run_batch(
    client: openai.OpenAI,
    lines: list[dict[str, Any]],
    endpoint: Literal["/v1/chat/completions", "/v1/responses"] = "/v1/chat/completions",
) -> openai.types.Batch:
    return client.batches.create(
        input_file_id=upload(client, lines), endpoint=endpoint, completion_window="24h"
    )


def ended(client: openai.OpenAI, batch_id: str) -> openai.types.Batch:
    return eventually_sync(
        lambda: (batch := client.batches.retrieve(batch_id)).status in ENDED and batch,
        f"batch {batch_id} ends",
        BATCH_DEADLINE_SECONDS,
        interval=0.1,
    )


def file_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def tenant_of(key: str) -> str:
    from gateway.auth import key_tenant

    return key_tenant(key)


def test_a_batch_completes_with_each_request_once_in_input_order_and_refusals_in_the_error_file(
    batches: Deployment,
) -> None:
    client = batches.client()
    lines = [request_line(f"r{n}") for n in range(30)]
    lines.insert(
        7, request_line("bad-tool", tools=None) | {"body": {**lines[0]["body"], "tools": [{"x": 1}]}}
    )
    batch = run_batch(client, lines)
    assert batch.status == "validating" and batch.request_counts is not None

    done = ended(client, batch.id)

    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
        31,
        30,
        1,
    )
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    output = file_lines(client, done.output_file_id)
    assert [line["custom_id"] for line in output] == [f"r{n}" for n in range(30)]
    assert all(line["response"]["status_code"] == 200 and line["error"] is None for line in output)
    assert all(line["response"]["body"]["choices"][0]["finish_reason"] == "length" for line in output)
    (refused,) = file_lines(client, done.error_file_id)
    assert refused["custom_id"] == "bad-tool"  # a tool without its function
    assert refused["response"]["status_code"] == 400
    assert refused["response"]["body"]["error"]["param"] == "tools.0.function"
    assert client.batches.list(limit=100).data[0].id == batch.id


def test_lines_that_are_no_request_of_the_batch_fail_it_with_their_errors_before_any_job(
    batches: Deployment,
) -> None:
    client = batches.client()
    lines = [
        request_line("a"),
        request_line("a"),  # duplicate custom_id
        request_line("b", url="/v1/completions"),
        request_line("c") | {"body": {**request_line("c")["body"], "model": "no-such-model"}},
        {"custom_id": "d", "method": "POST", "url": "/v1/chat/completions"},
    ]
    batch = run_batch(client, lines)

    done = ended(client, batch.id)

    assert done.status == "failed" and done.failed_at and done.errors and done.errors.data
    found = {(error.line, error.code) for error in done.errors.data}
    expected = {(2, "duplicate_custom_id"), (3, "mismatched_endpoint"), (4, "model_not_found")}
    assert expected <= found and (5, "missing_required_parameter") in found
    assert done.output_file_id is None and done.error_file_id is None
    assert not any(
        batches.redis.exists(f"{batches.settings.key_prefix}:job:{line_job_id(batch.id, n)}")
        for n in range(1, 6)
    )


def test_files_and_batches_of_another_key_are_not_found(batches: Deployment) -> None:
    owner, other = batches.client(key=KEYS[0]), batches.client(key=KEYS[1])
    batch = run_batch(owner, [request_line("x")])
    for read in (
        lambda: other.files.retrieve(batch.input_file_id),
        lambda: other.files.content(batch.input_file_id),
        lambda: other.files.delete(batch.input_file_id),
        lambda: other.batches.retrieve(batch.id),
        lambda: other.batches.cancel(batch.id),
        lambda: other.batches.create(
            input_file_id=batch.input_file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            read()
    assert batch.id not in [listed.id for listed in other.batches.list().data]
    assert batch.input_file_id not in [listed.id for listed in other.files.list().data]
    assert ended(owner, batch.id).status == "completed"


def test_an_upload_that_is_no_jsonl_is_refused_and_leaves_no_file(batches: Deployment) -> None:
    client = batches.client()
    before = {listed.id for listed in client.files.list().data}
    with pytest.raises(openai.BadRequestError, match="line 2"):
        client.files.create(file=("bad.jsonl", b'{"custom_id": "a"}\n[1, 2]\n'), purpose="batch")
    assert {listed.id for listed in client.files.list().data} == before
    boundary = "b0undary"
    garbled = f"--{boundary}\r\n\x06 no header\r\n--{boundary}--\r\n".encode()  # a part's head unreadable
    answer = httpx.post(
        f"{batches.gateways['a']}/v1/files",
        content=garbled,
        headers={
            "Authorization": f"Bearer {KEYS[0]}",
            "Content-Type": f"multipart/form-data; boundary={boundary}",
        },
    )
    assert answer.status_code == 400, answer.text
    assert "multipart/form-data" in answer.json()["error"]["message"]
    assert {listed.id for listed in client.files.list().data} == before
    uploaded = client.files.create(file=("ok.jsonl", b'{"a": 1}\n'), purpose="batch")
    assert client.files.content(uploaded.id).content == b'{"a": 1}\n'
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)


def test_a_cancel_mid_batch_stops_its_lines_cancels_its_running_jobs_and_keeps_what_finished(
    batches: Deployment,
) -> None:
    client = batches.client()
    # Each job takes two seconds: the first end lets the cancel find the rest running or unfed.
    lines = [request_line(f"r{n}", max_tokens=4 if n < 3 else 200) for n in range(600)]
    batch = run_batch(client, lines)
    eventually_sync(
        lambda: (
            (
                client.batches.retrieve(batch.id).request_counts
                or openai.types.BatchRequestCounts(completed=0, failed=0, total=0)
            ).completed
            >= 3
        ),
        "the batch's first jobs end",
        BATCH_DEADLINE_SECONDS,
    )

    cancelling = client.batches.cancel(batch.id)
    done = ended(client, batch.id)

    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    assert done.status == "cancelled" and done.cancelled_at and done.request_counts
    assert done.request_counts.completed + done.request_counts.failed == done.request_counts.total == 600
    output, errors = file_lines(client, done.output_file_id), file_lines(client, done.error_file_id)
    assert len(output) == done.request_counts.completed >= 3
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
    assert sorted(line["custom_id"] for line in output + errors) == sorted(f"r{n}" for n in range(600))
    fed = int(batches.field(batch.id, "fed") or 0)
    assert fed < 600  # the cancel stopped the feeding
    states = {
        batches.redis.hget(f"{batches.settings.key_prefix}:job:{line_job_id(batch.id, n)}", "status")
        for n in range(1, fed + 1)
    }
    assert "cancelled" in states and states <= {"completed", "cancelled"}


def test_a_batchs_end_is_announced_by_a_signed_webhook(batches: Deployment, receiver: Receiver) -> None:
    """A batch that completes, one that fails validation and one cancelled before it ran: each end
    reaches the key's default webhook once, signed, as OpenAI's batch webhook event."""
    client = batches.client(key=HOOKED_KEY)
    completing = run_batch(client, [request_line(f"r{n}") for n in range(3)])
    failing = run_batch(client, [request_line("a"), request_line("a")])
    cancelled = run_batch(client, [request_line(f"r{n}", max_tokens=2000) for n in range(50)])
    client.batches.cancel(cancelled.id)
    ends = {batch.id: ended(client, batch.id) for batch in (completing, failing, cancelled)}
    assert [batch.status for batch in ends.values()] == ["completed", "failed", "cancelled"]

    def announced() -> dict[str, Delivery]:
        by_batch = {delivery.event["data"]["id"]: delivery for delivery in receiver.got()}
        return by_batch if set(ends) <= set(by_batch) else {}

    by_batch = eventually_sync(announced, "the three ends are announced", BATCH_DEADLINE_SECONDS)

    ours = [delivery for delivery in receiver.got() if delivery.event["data"]["id"] in ends]
    assert len(ours) == 3 and all(delivery.verified for delivery in ours)
    for batch_id, event_type, at in (
        (completing.id, BatchCompletedWebhookEvent, ends[completing.id].completed_at),
        (failing.id, BatchFailedWebhookEvent, ends[failing.id].failed_at),
        (cancelled.id, BatchCancelledWebhookEvent, ends[cancelled.id].cancelled_at),
    ):
        delivery = by_batch[batch_id]
        event = event_type.model_validate(delivery.event)
        assert event.data.id == batch_id and event.object == "event"
        assert event.id == delivery.headers["webhook-id"] and at is not None
        assert abs(event.created_at - at) <= 1


def test_a_batch_on_the_responses_endpoint_answers_each_line_with_a_response_object(
    batches: Deployment,
) -> None:
    client = batches.client()
    custom_ids = [f"r{n}" for n in range(10)]
    batch = run_batch(client, [response_line(custom_id) for custom_id in custom_ids], "/v1/responses")

    done = ended(client, batch.id)

    assert done.status == "completed" and done.endpoint == "/v1/responses", done
    output = file_lines(client, done.output_file_id)
    assert [line["custom_id"] for line in output] == custom_ids  # each once, in input order
    assert all(line["response"]["status_code"] == 200 and line["error"] is None for line in output)
    responses = [Response.model_validate(line["response"]["body"]) for line in output]
    assert all(response.object == "response" and response.model == MODEL for response in responses)
    assert all(response.status == "incomplete" and response.output_text for response in responses)
    assert done.error_file_id is None


@pytest.fixture(scope="module")
def tool_batches(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """A deployment of the scripted pool that thinks and calls tools (tests/scripted_pool.py)."""
    pool = {name: value for name, value in SCRIPTED_POOL.items() if name != "engine"}
    with deployed(redis_url, tmp_path_factory, "", **pool) as deployment:
        yield deployment


def test_chat_lines_with_tools_answer_with_their_calls_and_reasoning(tool_batches: Deployment) -> None:
    """The scripted output stands in for a model that thinks and calls tools: each line's answer holds
    the call and the reasoning its job's stream holds, as a chat completion does."""
    client = tool_batches.client()
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    lines = [
        {
            "custom_id": f"t{number}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": "Weather?"}], "tools": [tool]},
        }
        for number in range(3)
    ]
    done = ended(client, run_batch(client, lines).id)

    assert done.status == "completed" and done.error_file_id is None, done
    output = file_lines(client, done.output_file_id)
    assert [line["custom_id"] for line in output] == ["t0", "t1", "t2"]
    for line in output:
        completion = ChatCompletion.model_validate(line["response"]["body"])
        choice = completion.choices[0]
        (call,) = choice.message.tool_calls or []
        assert call.type == "function" and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == ARGUMENTS
        assert choice.finish_reason == "tool_calls"
        assert (choice.message.model_extra or {}).get("reasoning") == REASONING


def test_gateways_killed_while_reading_the_input_and_while_writing_the_output_leave_one_whole_batch(
    batches: Deployment,
) -> None:
    """One gateway is SIGKILLed while it feeds the batch's lines, another while it writes its files:
    the last one finishes it; every line ran once, and each custom_id is in the output once."""
    batches.start_gateway("c")
    client = batches.client("c")
    tenant = tenant_of(KEYS[0])
    ended_before = batches.jobs_ended(tenant)
    lines = [request_line(f"r{n}", max_tokens=8) for n in range(1500)]
    batch = run_batch(client, lines)

    def feeding() -> str | None:
        fed = int(batches.field(batch.id, "fed") or 0)
        return batches.holder(batch.id) if 0 < fed < 1500 else None

    reader = eventually_sync(feeding, "a gateway feeds the batch", BATCH_DEADLINE_SECONDS, interval=0.01)
    batches.processes.kill(reader)
    survivors = [name for name in batches.gateways if name != reader]
    client = batches.client(survivors[0])

    def writing() -> str | None:
        return batches.holder(batch.id) if batches.field(batch.id, "status") == "finalizing" else None

    writer = eventually_sync(writing, "a gateway writes the files", BATCH_DEADLINE_SECONDS, interval=0.005)
    batches.processes.kill(writer)
    client = batches.client(next(name for name in survivors if name != writer))
    done = ended(client, batch.id)

    assert done.status == "completed" and done.request_counts
    assert (done.request_counts.completed, done.request_counts.failed) == (1500, 0)
    output = file_lines(client, done.output_file_id)
    assert [line["custom_id"] for line in output] == [f"r{n}" for n in range(1500)]
    assert [line["response"]["request_id"] for line in output] == [
        line_job_id(batch.id, n) for n in range(1, 1501)
    ]
    assert batches.jobs_ended(tenant) - ended_before == 1500  # no line ran twice
    outputs = [
        listed
        for listed in client.files.list(purpose="batch_output").data
        if listed.id == done.output_file_id
    ]
    assert len(outputs) == 1


def test_a_batch_past_its_window_expires_with_what_finished_and_says_so_by_webhook(
    batches: Deployment, receiver: Receiver
) -> None:
    batches.start_gateway("short-window", batch_window_seconds=3)
    client = batches.client("short-window", key=HOOKED_KEY)
    lines = [request_line(f"r{n}", max_tokens=4 if n < 5 else 2000) for n in range(20)]
    batch = run_batch(client, lines)

    done = ended(client, batch.id)

    assert done.status == "expired" and done.expired_at and done.request_counts
    assert done.request_counts.completed == 5
    assert done.request_counts.completed + done.request_counts.failed == 20
    output, errors = file_lines(client, done.output_file_id), file_lines(client, done.error_file_id)
    assert [line["custom_id"] for line in output] == [f"r{n}" for n in range(5)]
    assert [line["custom_id"] for line in errors] == [f"r{n}" for n in range(5, 20)]
    assert {line["error"]["code"] for line in errors} == {"batch_expired"}

    def announced() -> list[Delivery]:
        return [delivery for delivery in receiver.got() if delivery.event["data"]["id"] == batch.id]

    (delivery,) = eventually_sync(announced, "the expiry is announced", BATCH_DEADLINE_SECONDS)
    event = BatchExpiredWebhookEvent.model_validate(delivery.event)
    assert delivery.verified and event.type == "batch.expired" and done.expired_at is not None
    assert abs(event.created_at - done.expired_at) <= 1


@pytest.fixture(scope="module")
def short_retention(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """A deployment whose jobs' keys expire three seconds after they end: shorter than its batches run."""
    with deployed(redis_url, tmp_path_factory, "", retention_seconds=3) as deployment:
        yield deployment


def test_a_batch_running_past_the_retention_keeps_the_output_of_its_early_lines(
    short_retention: Deployment,
) -> None:
    """The first line ends at once, the second runs eight seconds: past the first job's retention."""
    client = short_retention.client()
    batch = run_batch(client, [request_line("short", max_tokens=4), request_line("long", max_tokens=800)])

    done = ended(client, batch.id)

    assert done.status == "completed" and done.request_counts
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 0)
    output = file_lines(client, done.output_file_id)
    assert [line["custom_id"] for line in output] == ["short", "long"]
    assert done.error_file_id is None
    job = f"{short_retention.settings.key_prefix}:job:{line_job_id(batch.id, 1)}"
    eventually_sync(lambda: short_retention.redis.ttl(job) <= 3, "once the files are written its keys go")


def test_a_line_whose_result_expired_while_no_gateway_drove_the_batch_is_an_error_not_a_success(
    short_retention: Deployment,
) -> None:
    """Every gateway is gone from before the first line's end until past its retention: its result is
    lost, and the batch says so in its error file and its counts."""
    client = short_retention.client()
    lines = [request_line("lost", max_tokens=100), request_line("kept", max_tokens=1000)]
    batch = run_batch(client, lines)
    eventually_sync(
        lambda: short_retention.field(batch.id, "fed") == "2", "both lines are fed", interval=0.01
    )
    for name in list(short_retention.gateways):
        short_retention.processes.kill(name)
    first = f"{short_retention.settings.key_prefix}:job:{line_job_id(batch.id, 1)}"
    eventually_sync(lambda: not short_retention.redis.exists(first), "the first line's keys expire", 30)
    short_retention.start_gateway("after")

    done = ended(short_retention.client("after"), batch.id)

    assert done.status == "completed" and done.request_counts
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 1)
    client = short_retention.client("after")
    assert [line["custom_id"] for line in file_lines(client, done.output_file_id)] == ["kept"]
    (lost,) = file_lines(client, done.error_file_id)
    assert lost["custom_id"] == "lost" and lost["error"]["code"] == "batch_result_expired"


def test_a_batch_whose_input_file_is_deleted_while_it_runs_completes_from_its_own_copy(
    batches: Deployment,
) -> None:
    batches.start_gateway("input-copy")  # of its own: earlier tests kill gateways
    client = batches.client("input-copy")
    lines = [request_line(f"r{n}", max_tokens=4 if n else 300) for n in range(5)]
    batch = run_batch(client, lines)
    eventually_sync(lambda: batches.field(batch.id, "status") == "in_progress", "the batch runs")

    assert client.files.delete(batch.input_file_id).deleted
    done = ended(client, batch.id)

    assert done.status == "completed" and done.request_counts
    assert (done.request_counts.completed, done.request_counts.failed) == (5, 0)
    output = file_lines(client, done.output_file_id)
    assert [line["custom_id"] for line in output] == [f"r{n}" for n in range(5)]
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(batch.input_file_id)
    copy = Path(batches.settings.files_dir) / derived_file_id(batch.id, "input")
    eventually_sync(lambda: not copy.exists(), "the batch's copy of its input goes with its end")


IDLE_MODEL = "idle"
"""A model the deployment declares and no worker serves: its jobs wait in its queue."""


@pytest.fixture(scope="module")
def bounded(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """A deployment whose queues hold five jobs, where a key runs two batches and a tenant three; the
    keys `team-1` and `team-2` are one tenant's."""
    keys_file = (
        '[[tenants]]\nname = "team"\n'
        '[[keys]]\nkey = "team-1"\ntenant = "team"\n[[keys]]\nkey = "team-2"\ntenant = "team"\n'
    )
    with deployed(
        redis_url,
        tmp_path_factory,
        keys_file,
        models=[IDLE_MODEL],
        max_queued_jobs=5,
        batch_max_running_per_key=2,
        batch_max_running_per_tenant=3,
    ) as deployment:
        yield deployment


def test_batch_lines_take_only_the_room_interactive_work_leaves_in_a_queue(bounded: Deployment) -> None:
    client = bounded.client()
    idle_line = {"body": {**request_line("x")["body"], "model": IDLE_MODEL}}
    running = [
        run_batch(client, [request_line(f"b{b}-{n}") | idle_line for n in range(10)]) for b in range(2)
    ]
    queue = Keys.of(bounded.settings).model(IDLE_MODEL).queue
    eventually_sync(
        lambda: sum(int(bounded.field(batch.id, "fed") or 0) for batch in running) == 5,
        "batch lines fill the queue's bound",
    )

    base_url, headers = bounded.gateways["a"], {"Authorization": f"Bearer {KEYS[1]}"}
    answers = [
        httpx.post(f"{base_url}/v1/jobs", json={"model": IDLE_MODEL, "prompt": "hi"}, headers=headers)
        for _ in range(6)
    ]

    assert [answer.status_code for answer in answers] == [202] * 5 + [429]
    assert bounded.redis.zcard(queue) == 10
    for batch in running:
        client.batches.cancel(batch.id)
        assert ended(client, batch.id).status == "cancelled"


def test_a_key_and_a_tenant_run_at_most_their_bound_of_batches_at_once(bounded: Deployment) -> None:
    one, two = bounded.client(key="team-1"), bounded.client(key="team-2")
    idle = [request_line("x") | {"body": {**request_line("x")["body"], "model": IDLE_MODEL}}]
    first = [run_batch(one, idle) for _ in range(2)]
    with pytest.raises(openai.RateLimitError) as per_key:
        run_batch(one, idle)
    third = run_batch(two, idle)
    with pytest.raises(openai.RateLimitError) as per_tenant:
        run_batch(two, idle)

    assert "batch_max_running_per_key" in str(per_key.value)
    assert "batch_max_running_per_tenant" in str(per_tenant.value)
    one.batches.cancel(first[0].id)
    assert ended(one, first[0].id).status == "cancelled"
    fourth = run_batch(two, idle)
    assert fourth.status == "validating"
    one.batches.cancel(first[1].id)
    for batch in (third, fourth):
        two.batches.cancel(batch.id)


@pytest.fixture
def s3_server(tmp_path: Path) -> Iterator[str]:
    """moto's standalone S3 server, a process of its own; its endpoint URL."""
    port = free_port()
    log = open(tmp_path / "moto.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"},
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        import httpx

        eventually_sync(lambda: _answers(httpx, endpoint), "moto's server answers", 30, interval=0.1)
        httpx.put(f"{endpoint}/batch-files")  # create the bucket (S3's CreateBucket)
        yield endpoint
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(10)
        log.close()


def _answers(httpx: Any, endpoint: str) -> bool:
    try:
        return bool(httpx.get(endpoint, timeout=1).status_code < 500)
    except httpx.HTTPError:
        return False


def test_files_and_a_batch_live_in_s3_compatible_storage(batches: Deployment, s3_server: str) -> None:
    batches.start_gateway(
        "s3",
        files_url="s3://batch-files/streampool",
        files_s3_endpoint=s3_server,
        files_s3_access_key_id="test",
        files_s3_secret_access_key="test",
    )
    client = batches.client("s3")
    # The other gateways store files in their folder: this batch must be driven where its file is.
    for name in [name for name in batches.gateways if name != "s3"]:
        batches.processes.stop(name)
        del batches.gateways[name]
    batch = run_batch(client, [request_line(f"r{n}") for n in range(10)])

    done = ended(client, batch.id)

    assert done.status == "completed"
    assert [line["custom_id"] for line in file_lines(client, done.output_file_id)] == [
        f"r{n}" for n in range(10)
    ]
    import httpx

    listing = httpx.get(f"{s3_server}/batch-files?list-type=2&prefix=streampool/").text
    assert batch.input_file_id in listing and str(done.output_file_id) in listing
