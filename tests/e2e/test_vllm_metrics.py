"""vLLM's own series on a real worker's metrics port: a job moves `vllm:generation_tokens_total` and
`vllm:request_success_total` by its amounts, under vLLM's names and its `model_name` label, in the same
exposition as streampool's series, and the whole page parses as Prometheus text.

The system is shared by the whole session, so every figure is compared before and after this test's
own job, once nothing else runs.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import System
from tests.deploy.test_grafana import DASHBOARD_VLLM_SERIES
from tests.helpers import Scrape, eventually, read_sse, scrape, submit

WAIT_SECONDS = 120


async def scrape_workers(client: httpx.AsyncClient, system: System) -> list[Scrape]:
    return [await scrape(client, f"{url}/metrics") for url in system.worker_urls]


def total(scrapes: list[Scrape], name: str, **labels: str) -> float:
    return sum(worker.value(name, **labels) for worker in scrapes)


async def idle_workers(client: httpx.AsyncClient, system: System) -> list[Scrape]:
    """The workers' scrapes once no engine holds a request (jobs of earlier tests may still be ending)."""

    def idle(now: list[Scrape]) -> bool:
        busy = ("streampool_worker_jobs_running", "vllm:num_requests_running", "vllm:num_requests_waiting")
        return sum(total(now, name) for name in busy) == 0

    what = "jobs of earlier tests end"
    return await eventually(lambda: scrape_workers(client, system), what, WAIT_SECONDS, 0.2, until=idle)


async def test_a_job_moves_vllms_token_and_success_counters_on_the_workers_port(
    client: httpx.AsyncClient, system: System
) -> None:
    model = {"model_name": system.settings.model_name}
    before = await idle_workers(client, system)
    job_id = await submit(client, prompt="Hi", max_tokens=8, temperature=0)
    assert (await read_sse(client, job_id))[-1][1]["type"] == "done"
    tokens = (await client.get(f"/v1/jobs/{job_id}")).json()["usage"]["completion_tokens"]

    def moved(name: str, now: list[Scrape]) -> float:
        return total(now, name, **model) - total(before, name, **model)

    def counted(now: list[Scrape]) -> bool:  # vLLM records a step's stats just after its outputs
        return moved("vllm:request_success_total", now) >= 1

    what = "vLLM counts the job's success"
    after = await eventually(lambda: scrape_workers(client, system), what, WAIT_SECONDS, 0.2, until=counted)

    assert tokens > 0
    assert moved("vllm:generation_tokens_total", after) == tokens
    assert moved("vllm:request_success_total", after) == 1
    streampool_tokens = total(after, "streampool_generated_tokens_total") - total(
        before, "streampool_generated_tokens_total"
    )
    assert streampool_tokens == tokens


async def test_each_workers_page_parses_and_holds_streampools_series_and_the_dashboards_vllm_series(
    client: httpx.AsyncClient, system: System
) -> None:
    for url in system.worker_urls:
        answer = await client.get(f"{url}/metrics")
        assert answer.status_code == 200, answer.text
        families = list(text_string_to_metric_families(answer.text))
        names = {sample.name for family in families for sample in family.samples}
        assert DASHBOARD_VLLM_SERIES <= names, sorted(DASHBOARD_VLLM_SERIES - names)
        assert "streampool_generated_tokens_total" in names
        # vLLM's per-engine series carry the served name (its *_info ones carry configuration instead).
        panel_labels = [
            sample.labels for f in families for sample in f.samples if sample.name in DASHBOARD_VLLM_SERIES
        ]
        assert panel_labels
        assert all(labels.get("model_name") == system.settings.model_name for labels in panel_labels)
