"""The resume routes' answers that need no worker, against a real gateway process with API keys: a kept
answer's stream is its own key's alone (404 for another, in OpenAI's error shape), and a bad
`starting_after` is a 400 naming it. No worker runs: the jobs stay queued. A kept answer resumed
chunk for chunk is tests/faults/test_kept_answers.py's."""

from __future__ import annotations

import httpx

from gateway.generation import JOB_ID_HEADER
from shared.config import DEFAULT_MODEL_DIR
from tests.gateway.keyed_gateway import KEY_A, KEY_B, KeyedGateway, bearer

CHAT = {
    "model": DEFAULT_MODEL_DIR.name,
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 8,
    "stream": True,
    "store": True,
}


async def test_a_kept_answers_stream_is_its_own_keys_alone(keyed: KeyedGateway) -> None:
    async with httpx.AsyncClient(base_url=keyed.base_url, timeout=30) as http:
        async with http.stream("POST", "/v1/chat/completions", json=CHAT, headers=bearer(KEY_A)) as posted:
            assert posted.status_code == 200
            job_id = posted.headers[JOB_ID_HEADER]
        path = f"/v1/chat/completions/chatcmpl-{job_id}/chunks"
        async with http.stream("GET", path, headers=bearer(KEY_A)) as resumed:
            assert resumed.status_code == 200
            assert resumed.headers["content-type"].startswith("text/event-stream")
            assert resumed.headers[JOB_ID_HEADER] == job_id
        stranger = await http.get(path, headers=bearer(KEY_B))
        assert stranger.status_code == 404
        assert stranger.json()["error"]["message"].startswith(f"no chat completion chatcmpl-{job_id} ")
        unknown = await http.get("/v1/completions/cmpl-x/chunks", headers=bearer(KEY_A))
        assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "invalid_request_error"
        negative = await http.get(path, params={"starting_after": -1}, headers=bearer(KEY_A))
        assert negative.status_code == 400 and negative.json()["error"]["param"] == "query.starting_after"
