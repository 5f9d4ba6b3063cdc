"""A tenant's tokens per minute are counted from the exact usage a real worker records at a job's end: a
job on the session's engines, through a gateway in this process with a tenants file (on the session's
Redis and prefix), fills its tenant's minute and the next submission is refused."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import System
from tests.gateway.keyed_gateway import KEY_A, bearer
from tests.helpers import JOB_DEADLINE_SECONDS, in_process_gateway, wait_for_status

TENANTS = (
    f'[[tenants]]\nname = "small"\ntokens_per_minute = 10\n[[keys]]\nkey = "{KEY_A}"\ntenant = "small"\n'
)


async def test_tokens_per_minute_counts_a_real_jobs_usage(system: System, tmp_path: Path) -> None:
    keys_file = tmp_path / "tenants.toml"
    keys_file.write_text(TENANTS)
    settings = system.settings.model_copy(update={"allow_unauthenticated": False, "api_keys_file": keys_file})
    body = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    async with in_process_gateway(settings) as gateway:
        gateway.headers.update(bearer(KEY_A))
        answer = await gateway.post("/v1/jobs", json=body)
        assert answer.status_code == 202, answer.text
        record = await wait_for_status(gateway, answer.json()["id"], {"completed"}, JOB_DEADLINE_SECONDS)
        usage = (await gateway.get("/v1/usage")).json()["usage"]
        refused = await gateway.post("/v1/jobs", json=body)
    spent = record["usage"]["prompt_tokens"] + record["usage"]["completion_tokens"]
    assert spent > 10 and record["usage"]["completion_tokens"] > 0
    assert usage["tokens_last_minute"] == usage["tokens_total"] == spent and usage["jobs_ended_total"] == 1
    assert refused.status_code == 429 and refused.json()["limit"] == "tokens_per_minute"
