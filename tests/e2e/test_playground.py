"""The browser playground at `GET /`: a real Chromium drives the page against the running system."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from playwright.sync_api import Browser, Page, Request, expect

from gateway.routes import playground as playground_routes
from tests.conftest import System
from tests.e2e.browser import screenshot
from tests.gateway.keyed_gateway import KEY_A, KeyedGateway, bearer


@pytest.fixture(scope="module")
def system(synthetic_system: System) -> System:
    """The subject is the page in a browser, not generation: its workers run the synthetic engine."""
    return synthetic_system


FINISHED = re.compile(r"^(completed|cancelled|failed|error)$")
GENERATION_MS = 180_000  # generous: other suites may share the CPU
STORY = "Once upon a time, in a lighthouse by the sea, there lived"
SUBMITS = ("/v1/jobs", "/v1/chat/completions", "/v1/responses")

# Every change to the job section, as (state, length of the text so far), to see the text arrive in steps.
RECORD_CHANGES = """() => {
  window.changes = [];
  const section = document.getElementById("job"), text = document.getElementById("text");
  new MutationObserver(() => window.changes.push([section.dataset.state, text.textContent.length]))
    .observe(section, {subtree: true, childList: true, characterData: true, attributes: true});
}"""
STREAMING_OR_OVER = """(tokens) => {
  const state = document.getElementById("job").dataset.state;
  const seen = Number(document.getElementById("tokens").textContent);
  return !["submitting", "queued", "running"].includes(state) || (state === "running" && seen >= tokens);
}"""


@dataclass
class Playground:
    """The page, loaded from the gateway, and the script errors it raised."""

    page: Page
    base_url: str
    errors: list[str]
    model: str

    @property
    def state(self) -> str:
        return self.page.locator("#job").get_attribute("data-state") or ""

    @property
    def text(self) -> str:
        return self.page.locator("#text").text_content() or ""

    @property
    def job_id(self) -> str:
        return self.page.locator("#job-id").text_content() or ""

    def generate(self) -> dict[str, Any]:
        """Clicks Generate; the body the page posted to /v1/jobs (a prompt) or /v1/chat/completions (a
        chat)."""
        with self.page.expect_request(lambda r: r.method == "POST" and r.url.endswith(SUBMITS)) as sent:
            self.page.click("#generate")
        body = sent.value.post_data_json
        assert isinstance(body, dict), body
        return body

    def wait_streaming(self, tokens: int) -> None:
        """Until the job runs and `tokens` tokens are shown (or it is already over: then it fails)."""
        self.page.wait_for_function(STREAMING_OR_OVER, arg=tokens, timeout=GENERATION_MS)
        assert self.state == "running", f"the job was over before {tokens} tokens: {self.state}"

    def wait_finished(self) -> str:
        expect(self.page.locator("#job")).to_have_attribute("data-state", FINISHED, timeout=GENERATION_MS)
        return self.state

    def record(self) -> dict[str, Any]:
        answer = httpx.get(f"{self.base_url}/v1/jobs/{self.job_id}")
        assert answer.status_code == 200, answer.text
        record: dict[str, Any] = answer.json()
        return record


@pytest.fixture
def playground(browser: Browser, system: System) -> Iterator[Playground]:
    context = browser.new_context(base_url=system.base_url)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto("/")
    expect(page.locator("#model")).to_have_text(system.settings.model_name)
    yield Playground(page, system.base_url, errors, system.settings.model_name)
    context.close()


def test_root_serves_the_page_and_its_assets(system: System) -> None:
    page = httpx.get(f"{system.base_url}/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "<title>streampool playground</title>" in page.text
    assets = re.findall(r'(?:href|src)="(/playground/[^"]+)"', page.text)
    assert sorted(assets) == [
        "/playground/playground.css",
        "/playground/playground.js",
        "/playground/theme.css",
    ]
    types = {asset: httpx.get(f"{system.base_url}{asset}").headers["content-type"] for asset in assets}
    assert types["/playground/playground.js"].startswith("text/javascript")
    assert types["/playground/playground.css"].startswith("text/css")
    assert types["/playground/theme.css"].startswith("text/css")  # the console's too
    missing = httpx.get(f"{system.base_url}/playground/app.py")
    assert missing.status_code == 404 and missing.json()["error_type"] == "not_found"
    # Which models chat: the synthetic workers publish the default model's card, chat template and all.
    assert httpx.get(f"{system.base_url}/v1/playground/models").json() == {system.settings.model_name: True}


def test_playground_leaves_post_root_to_the_tgi_routes() -> None:
    app = FastAPI()
    app.include_router(playground_routes.router)

    @app.post("/")  # stands in for the TGI route, included after the playground
    async def tgi_root() -> dict[str, str]:
        return {"answered_by": "tgi"}

    with TestClient(app) as client:
        assert client.post("/", json={"inputs": "Hi"}).json() == {"answered_by": "tgi"}
        assert client.get("/").headers["content-type"].startswith("text/html")


def test_the_page_opens_in_chat_mode_for_a_model_whose_card_has_a_chat_template(
    playground: Playground,
) -> None:
    expect(playground.page.locator("input[name=mode][value=chat]")).to_be_checked()
    expect(playground.page.locator("#user")).to_be_visible()
    expect(playground.page.locator("#prompt")).to_be_hidden()


def test_a_prompt_streams_into_the_page_and_ends_as_the_record_text(playground: Playground) -> None:
    page = playground.page
    page.check("input[name=mode][value=prompt]")
    page.fill("#prompt", "The three primary colors are")
    page.fill("input[name=max_tokens]", "40")
    page.fill("input[name=temperature]", "0")
    page.evaluate(RECORD_CHANGES)
    body = playground.generate()
    assert body == {
        "model": playground.model,  # the picked one: the only one /v1/models lists
        "prompt": "The three primary colors are",
        "max_tokens": 40,
        "temperature": 0,
        "top_p": 1,
        "stream_step": 1,
    }

    assert playground.wait_finished() == "completed"
    record = playground.record()
    assert record["status"] == "completed"
    assert playground.text == record["output"]["text"] != ""
    assert page.locator("#tokens").text_content() == str(record["output"]["token_count"])
    assert re.fullmatch(r"\d+ ms", page.locator("#ttft").text_content() or "")
    assert page.url.endswith(f"/?job={record['id']}")
    final_length = page.evaluate("document.getElementById('text').textContent.length")
    changes: list[tuple[str, int]] = page.evaluate("window.changes")
    assert any(state == "running" and 0 < length < final_length for state, length in changes), changes
    assert playground.errors == []


def test_cancel_in_chat_mode_ends_the_job_cancelled(playground: Playground) -> None:
    page = playground.page
    page.check("input[name=mode][value=chat]")
    page.fill("#system", "You are a storyteller.")
    page.fill("#user", "Write a very long story about a dragon.")
    page.fill("input[name=max_tokens]", "400")
    page.fill("input[name=temperature]", "0")  # greedy: a long story, not an early end
    body = playground.generate()
    assert body["messages"] == [
        {"role": "system", "content": "You are a storyteller."},
        {"role": "user", "content": "Write a very long story about a dragon."},
    ]
    assert "prompt" not in body and "stream_step" not in body  # a field the job API alone takes
    assert (body["stream"], body["store"]) == (True, True)  # a stored chat completion: it outlives the tab

    playground.wait_streaming(tokens=3)
    page.click("#cancel")
    assert playground.wait_finished() == "cancelled"
    record = playground.record()
    assert record["status"] == "cancelled"
    assert playground.text == record["output"]["text"]
    assert record["output"]["token_count"] < 400
    assert page.locator("#outcome").text_content() == (
        f"Cancelled: {record['usage']['prompt_tokens']} prompt + "
        f"{record['usage']['completion_tokens']} completion tokens."
    )
    assert page.locator("#cancel").is_disabled() and page.locator("#generate").is_enabled()
    assert playground.errors == []


def test_a_reload_mid_stream_resumes_without_gap_or_duplicate(playground: Playground) -> None:
    page = playground.page
    page.check("input[name=mode][value=prompt]")
    page.fill("#prompt", STORY)
    page.fill("input[name=max_tokens]", "250")
    page.fill("input[name=temperature]", "0")  # greedy: this story runs the full 250 tokens
    playground.generate()
    playground.wait_streaming(tokens=10)
    before = playground.text

    def resumes(request: Request) -> bool:
        return "/events?after=" in request.url

    with page.expect_request(resumes) as resumed:
        page.reload()
    assert re.search(r"/events\?after=\d+-\d+$", resumed.value.url)
    assert playground.wait_finished() == "completed"
    record = playground.record()
    assert record["status"] == "completed"
    assert playground.text == record["output"]["text"]
    assert record["output"]["text"].startswith(before) and len(record["output"]["text"]) > len(before)
    assert page.locator("#tokens").text_content() == str(record["output"]["token_count"])
    assert page.locator("#prompt").input_value() == STORY  # the form came back too
    assert playground.errors == []


def test_a_reload_mid_chat_resumes_its_stored_completion_after_the_chunks_shown(
    playground: Playground,
) -> None:
    page = playground.page
    page.check("input[name=mode][value=chat]")
    page.fill("#user", STORY)
    page.fill("input[name=max_tokens]", "250")
    page.fill("input[name=temperature]", "0")  # greedy: this story runs the full 250 tokens
    playground.generate()
    playground.wait_streaming(tokens=10)
    before = playground.text

    with page.expect_request(lambda request: "/chunks?starting_after=" in request.url) as resumed:
        page.reload()
    assert re.search(r"/v1/chat/completions/[0-9a-f]{32}/chunks\?starting_after=\d+$", resumed.value.url)
    assert int(resumed.value.url.rsplit("=", 1)[1]) > 10  # the chunks shown before the reload
    assert playground.wait_finished() == "completed"
    record = playground.record()
    assert record["status"] == "completed" and record["output"]["token_count"] == 250
    assert playground.text == record["output"]["text"]
    assert record["output"]["text"].startswith(before) and len(record["output"]["text"]) > len(before)
    assert page.locator("#tokens").text_content() == "250"
    assert page.locator("#outcome").text_content() == (
        f"Finished (length): {record['usage']['prompt_tokens']} prompt + 250 completion tokens."
    )
    assert page.locator("#user").input_value() == STORY  # the form came back too
    assert playground.errors == []


def test_a_rejected_request_shows_the_gateway_error(playground: Playground, system: System) -> None:
    page = playground.page
    page.check("input[name=mode][value=prompt]")
    page.fill("#prompt", "Hi")
    page.fill("input[name=max_tokens]", str(system.settings.max_tokens_limit + 1))
    playground.generate()
    assert playground.wait_finished() == "error"
    expect(page.locator("#error")).to_have_text(
        f"max_tokens: must be at most {system.settings.max_tokens_limit} (422 validation)"
    )
    assert "job=" not in page.url and page.locator("#generate").is_enabled()
    assert playground.errors == []


def test_a_two_turn_chat_keeps_its_conversation_and_resumes_after_a_reload(playground: Playground) -> None:
    page = playground.page
    page.fill("#user", "Name a color.")
    page.fill("input[name=max_tokens]", "5")
    page.fill("input[name=temperature]", "0")
    playground.generate()
    assert playground.wait_finished() == "completed"
    first = playground.text
    assert first == playground.record()["output"]["text"] != ""

    page.fill("#user", STORY)
    page.fill("input[name=max_tokens]", "150")
    body = playground.generate()
    assert body["messages"] == [
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": first},
        {"role": "user", "content": STORY},
    ]
    playground.wait_streaming(tokens=10)
    with page.expect_request(lambda request: "/chunks?starting_after=" in request.url):
        page.reload()
    assert playground.wait_finished() == "completed"
    assert playground.text == playground.record()["output"]["text"]
    expect(page.locator("#conversation li")).to_have_text(["Name a color.", first, STORY])
    expect(page.locator("#new-chat")).to_be_visible()
    screenshot(page, "playground")

    page.click("#new-chat")  # the next chat begins again
    expect(page.locator("#conversation")).to_be_hidden()
    page.fill("input[name=max_tokens]", "5")
    assert playground.generate()["messages"] == [{"role": "user", "content": STORY}]
    assert playground.wait_finished() == "completed"
    assert playground.errors == []


def test_a_background_response_continues_its_conversation_and_resumes_after_a_reload(
    playground: Playground,
) -> None:
    page = playground.page
    page.check("input[name=mode][value=responses]")
    page.fill("#input", "Name a color.")
    page.fill("input[name=max_tokens]", "5")
    page.fill("input[name=temperature]", "0")
    body = playground.generate()
    assert (body["input"], body["background"], body["max_output_tokens"]) == ("Name a color.", True, 5)
    assert (body["stream"], body["store"]) == (True, True) and "max_tokens" not in body
    assert playground.wait_finished() == "completed"
    first_job = playground.job_id
    assert playground.text == playground.record()["output"]["text"] != ""

    page.fill("#input", STORY)
    page.fill("input[name=max_tokens]", "150")
    body = playground.generate()
    assert body["previous_response_id"] == f"resp_{first_job}"
    playground.wait_streaming(tokens=10)
    with page.expect_request(lambda request: "starting_after=" in request.url) as resumed:
        page.reload()
    assert re.search(r"/v1/responses/resp_[0-9a-f]{32}\?stream=true&starting_after=\d+$", resumed.value.url)
    assert playground.wait_finished() == "completed"
    record = playground.record()
    assert playground.text == record["output"]["text"] and record["output"]["token_count"] == 150
    assert page.locator("#tokens").text_content() == "150"
    expect(page.locator("#conversation li")).to_have_count(3)
    assert playground.errors == []


def test_the_jobs_events_show_on_demand(playground: Playground) -> None:
    page = playground.page
    page.fill("#user", "Hi")
    page.fill("input[name=max_tokens]", "3")
    playground.generate()
    assert playground.wait_finished() == "completed"
    expect(page.locator("#events-log li")).to_have_count(0)  # read only when asked for
    page.click("#events summary")
    events = page.locator("#events-log li")
    expect(events.first).to_contain_text('"state":"queued"')
    expect(events.last).to_contain_text('"type":"done"')
    assert playground.errors == []


def test_a_gateway_that_asks_for_a_key_gets_one_and_streams_with_it(
    browser: Browser, keyed: KeyedGateway
) -> None:
    context = browser.new_context(base_url=keyed.base_url)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto("/")
    expect(page.locator("#auth")).to_be_visible()  # /v1/models answered 401
    page.fill("#api-key", KEY_A)
    page.click("#use-key")
    expect(page.locator("#auth")).to_be_hidden()
    # The declared model, picked: its job queues until a worker of it starts.
    expect(page.locator("#model")).to_have_text(f"{keyed.settings.default_model} (no live worker)")
    # No worker has published its card: no chat template is known, and the page opens in Prompt mode.
    expect(page.locator("input[name=mode][value=prompt]")).to_be_checked()
    expect(page.locator("#mode-hint")).to_have_text("No chat template is known for this model: Prompt mode.")

    page.fill("#prompt", "Hi")
    with page.expect_request(lambda r: "/events" in r.url) as streamed:
        page.click("#generate")
    assert streamed.value.headers["authorization"] == f"Bearer {KEY_A}"
    assert streamed.value.headers["accept"] == "text/event-stream"
    expect(page.locator("#job")).to_have_attribute("data-state", "queued")  # the stream's first event
    page.click("#cancel")
    # The cancel's `cancelled` event arrives through the same fetch() stream.
    expect(page.locator("#job")).to_have_attribute("data-state", "cancelled")
    expect(page.locator("#outcome")).to_have_text("Cancelled: 0 prompt + 0 completion tokens.")
    record = httpx.get(
        f"{keyed.base_url}/v1/jobs/{page.locator('#job-id').text_content()}", headers=bearer(KEY_A)
    )
    assert (record.json()["status"], record.json()["model"]) == ("cancelled", keyed.settings.default_model)
    assert errors == []
    context.close()
