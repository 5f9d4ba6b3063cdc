"""The gateway's base install has no torch and no vLLM: building the app must not import them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
from gateway.app import create_app
from shared.config import Settings
create_app(Settings(allow_unauthenticated=True))
print(json.dumps(sorted(name for name in sys.modules if name.split('.')[0] in ('torch', 'vllm'))))
"""


def test_creating_the_gateway_app_imports_neither_torch_nor_vllm() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout.splitlines()[-1]) == []
