"""The documentation site: it builds in strict mode, so that a broken link or anchor fails the suite, and
its configuration page lists every setting, as docs/hooks.py makes it from shared/config.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.config import ClientSettings, Settings

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml")]
        + ["--site-dir", str(out)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, build.stderr
    return out


def test_the_docs_build_in_strict_mode_with_the_readme_as_home_page(site: Path) -> None:
    assert "Where to start reading the code" in (site / "index.html").read_text()
    assert (site / "bench" / "RESULTS" / "index.html").exists()


@pytest.mark.parametrize("settings", [Settings, ClientSettings])
def test_every_setting_is_on_the_configuration_page_with_its_variable_flag_and_description(
    site: Path, settings: type[Settings] | type[ClientSettings]
) -> None:
    page = (site / "configuration" / "index.html").read_text()
    for name, field in settings.model_fields.items():
        assert f"<code>STREAMPOOL_{name.upper()}</code>" in page, name
        assert f"<code>--{name.replace('_', '-')}</code>" in page, name
        assert field.description and field.description.split("`")[0] in page, name
