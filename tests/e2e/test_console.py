"""The console at `GET /console`: its JSON routes, and a real Chromium driving the page against a running
system of synthetic workers (the subject is the page and what it reads, not generation)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.conftest import System
from tests.e2e.browser import screenshot
from tests.gateway.keyed_gateway import KEY_A, KeyedGateway, bearer

TIMEOUT_MS = 60_000  # generous: other suites may share the CPU
TOKENS_ABOVE = "(first) => Number(document.getElementById('job-tokens').textContent) > first"
LONG = 1500  # tokens: at the synthetic engine's 0.03 s a step, a job that runs until it is cancelled


@pytest.fixture(scope="module")
def system(synthetic_system: System) -> System:
    return synthetic_system


def submit(system: System, max_tokens: int = LONG) -> str:
    answer = httpx.post(
        f"{system.base_url}/v1/jobs", json={"prompt": "Tell a long story", "max_tokens": max_tokens}
    )
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["id"]
    return job_id


def record(system: System, job_id: str) -> dict[str, Any]:
    answer = httpx.get(f"{system.base_url}/v1/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def wait_status(system: System, job_id: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while (found := record(system, job_id))["status"] != status and time.monotonic() < deadline:
        time.sleep(0.05)
    assert found["status"] == status, found
    return found


@pytest.fixture
def console(browser: Browser, system: System) -> Iterator[Page]:
    context = browser.new_context(base_url=system.base_url, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto("/console")
    yield page
    assert errors == []
    context.close()


def test_the_page_and_its_assets_are_served_to_anyone(keyed: KeyedGateway) -> None:
    page = httpx.get(f"{keyed.base_url}/console")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<title>streampool console</title>" in page.text
    assets = re.findall(r'(?:href|src)="(/console/[^"]+)"', page.text)
    assert sorted(assets) == ["/console/console.css", "/console/console.js"]
    assert '<link rel="stylesheet" href="/playground/theme.css">' in page.text  # the playground's colours
    for asset, media_type in zip(sorted(assets), ["text/css", "text/javascript"], strict=True):
        assert httpx.get(f"{keyed.base_url}{asset}").headers["content-type"].startswith(media_type)
    assert httpx.get(f"{keyed.base_url}/console/app.py").status_code == 404


def test_its_data_needs_an_admin_key_where_the_gateway_asks_for_keys(keyed: KeyedGateway) -> None:
    url = f"{keyed.base_url}/v1/console/snapshot"
    assert httpx.get(url).status_code == 401
    refused = httpx.get(url, headers=bearer(KEY_A))  # a key, not an admin's
    assert refused.status_code == 403 and "admin key" in refused.json()["error"]
    assert httpx.get(f"{keyed.base_url}/v1/console/jobs", headers=bearer(KEY_A)).status_code == 403


def test_any_jobs_events_are_read_through_the_console(system: System) -> None:
    job_id = submit(system, max_tokens=3)
    wait_status(system, job_id, "completed")
    page = httpx.get(f"{system.base_url}/v1/console/jobs/{job_id}/events").json()
    assert [event["type"] for event in page["events"]][-1] == "done" and page["done"] is True
    assert httpx.get(f"{system.base_url}/v1/console/jobs/{'0' * 32}/events").status_code == 404
    # A job's other keys (`<id>:<suffix>`) are no job's, on each of the console's job routes.
    for suffix in (":events", ":cancel", ":lease", ":webhook"):
        url = f"{system.base_url}/v1/console/jobs/{job_id}{suffix}"
        assert httpx.get(url).status_code == 404
        assert httpx.get(f"{url}/events").status_code == 404
        assert httpx.post(f"{url}/cancel").status_code == 404


def test_the_snapshot_shows_the_workers_and_queues_and_is_read_once_a_second(system: System) -> None:
    url = f"{system.base_url}/v1/console/snapshot"
    snapshot = httpx.get(url).json()
    model = system.settings.model_name
    assert len(snapshot["workers"]) == len(system.workers)
    for worker in snapshot["workers"]:
        assert worker["model"] == model and worker["max_jobs"] == system.settings.worker_max_jobs
        assert worker["kv_cache_usage"] is None  # the synthetic engine has no KV cache
        assert worker["draining"] is False and worker["heartbeat_age"] < system.settings.heartbeat_ttl_seconds
    [queue] = [queue for queue in snapshot["queues"] if queue["model"] == model]
    assert queue["workers"] == len(system.workers)
    assert snapshot["tenants"] == [] and snapshot["batches"] == []  # no keys file: no tenants
    again = httpx.get(url).json()
    if again["at"] - snapshot["at"] < 0.9:  # asked again within the second: the same read answers
        assert again == snapshot


def test_a_running_job_shows_with_its_tokens_rising_and_a_cancel_from_the_console_ends_it(
    console: Page, system: System
) -> None:
    job_id = submit(system)
    wait_status(system, job_id, "running")
    expect(console.locator("#workers tbody tr[data-worker]")).to_have_count(len(system.workers))
    console.select_option("#filters select[name=state]", "running")
    row = console.locator(f"#jobs tr[data-job='{job_id}']")
    expect(row).to_have_attribute("data-state", "running", timeout=TIMEOUT_MS)
    row.locator("button.link").click()
    tokens = console.locator("#job-tokens")
    expect(tokens).not_to_have_text("0", timeout=TIMEOUT_MS)
    first = int(tokens.text_content() or 0)
    console.wait_for_function(TOKENS_ABOVE, arg=first, timeout=TIMEOUT_MS)
    expect(console.locator("#job-text")).not_to_be_empty()
    expect(console.locator("#rate-chart polyline")).to_have_count(1)
    screenshot(console, "console")

    row.get_by_role("button", name="Cancel").click()
    expect(console.locator("#job-state")).to_have_text("cancelled", timeout=TIMEOUT_MS)
    ended = record(system, job_id)
    assert ended["status"] == "cancelled" and ended["output"]["token_count"] < LONG
    expect(console.locator("#job-tokens")).to_have_text(str(ended["output"]["token_count"]))
    expect(console.locator("#cancel-job")).to_be_disabled()


def test_the_jobs_table_filters_by_state(console: Page, system: System) -> None:
    cancelled = submit(system)
    httpx.post(f"{system.base_url}/v1/jobs/{cancelled}/cancel").raise_for_status()
    running = submit(system)
    wait_status(system, running, "running")

    console.select_option("#filters select[name=state]", "cancelled")
    expect(console.locator(f"#jobs tr[data-job='{cancelled}']")).to_be_visible(timeout=TIMEOUT_MS)
    states = console.locator("#jobs tr[data-job]").evaluate_all("rows => rows.map(row => row.dataset.state)")
    assert states and set(states) == {"cancelled"}
    assert console.locator(f"#jobs tr[data-job='{running}']").count() == 0
    console.locator(f"#jobs tr[data-job='{cancelled}'] button.link").click()  # its replay
    expect(console.locator("#job-state")).to_have_text("cancelled", timeout=TIMEOUT_MS)
    ended = record(system, cancelled)
    expect(console.locator("#job-tokens")).to_have_text(str(ended["output"]["token_count"]))
    assert console.locator("#job-text").text_content() == ended["output"]["text"]

    console.select_option("#filters select[name=state]", "running")
    expect(console.locator(f"#jobs tr[data-job='{running}']")).to_be_visible(timeout=TIMEOUT_MS)
    expect(console.locator(f"#jobs tr[data-job='{cancelled}']")).to_have_count(0)
    console.select_option("#filters select[name=model]", system.settings.model_name)
    console.select_option("#filters select[name=max_age]", "60")
    expect(console.locator(f"#jobs tr[data-job='{running}']")).to_be_visible(timeout=TIMEOUT_MS)
    httpx.post(f"{system.base_url}/v1/jobs/{running}/cancel").raise_for_status()


def test_a_batch_in_progress_shows_its_counts_and_a_progress_bar(console: Page, system: System) -> None:
    model = system.settings.model_name
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": LONG}
    lines = [
        {"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for n in range(3)
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    with openai.OpenAI(base_url=f"{system.base_url}/v1", api_key="none", max_retries=0) as client:
        upload = client.files.create(file=("input.jsonl", data), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        try:
            row = console.locator("#batches tbody tr", has_text=batch.id)
            expect(row).to_contain_text("under way, of 3", timeout=TIMEOUT_MS)
            expect(row.locator("progress")).to_have_attribute("max", "3")
            expect(row).to_contain_text("/v1/chat/completions")
        finally:
            client.batches.cancel(batch.id)
        expect(console.locator("#batches tbody tr", has_text=batch.id)).to_have_count(0, timeout=TIMEOUT_MS)
