"""Debian's Chromium, which Playwright drives (its own browsers are not installed), for the tests of the
gateway's pages: the playground and the console (the `browser` fixture is tests/e2e/conftest.py's)."""

from __future__ import annotations

import os
from pathlib import Path

from playwright.sync_api import Page

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = os.environ.get("STREAMPOOL_SCREENSHOTS")
"""A folder for the pages' screenshots the tests take (docs/images, for the docs); none: not kept."""


def screenshot(page: Page, name: str) -> None:
    """Keeps the page's picture as `<name>.png` in `SCREENSHOTS`, where that is set."""
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=True)
