"""Who may read the console's data (the metrics token or an admin key, where the gateway asks for keys),
and who may cancel from it (an admin key)."""

from __future__ import annotations

import uuid
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient

from gateway.auth import ApiKeys
from gateway.errors import install_error_handlers
from gateway.routes.console import console_access, console_admin
from tests.conftest import make_settings

ADMIN, USER, TOKEN = (f"{name}-{uuid.uuid4().hex}" for name in ("admin", "user", "metrics"))


def client(tmp_path: Path, **overrides: object) -> TestClient:
    app = FastAPI(dependencies=[Depends(console_access)])
    install_error_handlers(app)
    app.state.api_keys = ApiKeys.from_settings(make_settings("redis://127.0.0.1:1", **overrides))

    @app.get("/data")
    async def data() -> dict[str, bool]:
        return {"served": True}

    @app.post("/change", dependencies=[Depends(console_admin)])
    async def change() -> dict[str, bool]:
        return {"changed": True}

    return TestClient(app)


def test_an_admin_key_or_the_metrics_token_opens_it_and_nothing_else(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(f'[[keys]]\nkey = "{ADMIN}"\nadmin = true\n\n[[keys]]\nkey = "{USER}"\n')
    with client(tmp_path, api_keys_file=keys_file, metrics_token=TOKEN) as http:
        for opener in (ADMIN, TOKEN):
            assert http.get("/data", headers={"Authorization": f"Bearer {opener}"}).json() == {"served": True}
        assert http.post("/change", headers={"Authorization": f"Bearer {ADMIN}"}).json() == {"changed": True}
        read_only = http.post("/change", headers={"Authorization": f"Bearer {TOKEN}"})
        assert read_only.status_code == 403 and "only reads" in read_only.json()["error"]
        refused = http.get("/data", headers={"Authorization": f"Bearer {USER}"})
        assert refused.status_code == 403 and "admin key" in refused.json()["error"]
        assert http.get("/data").status_code == 401
        assert http.get("/data", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_a_gateway_without_keys_opens_it_to_anyone(tmp_path: Path) -> None:
    with client(tmp_path, allow_unauthenticated=True) as http:
        assert http.get("/data").json() == {"served": True}
        assert http.post("/change").json() == {"changed": True}
