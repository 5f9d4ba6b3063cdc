"""The packages by role hold: the import-linter contracts in pyproject.toml, checked in every test run
(`make lint` checks them too). The check reads the source; it imports nothing and starts no engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [lint_imports, "--no-logo", "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
