"""`gateway`: an in-process gateway client on the `settings` fixture that each test module defines."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from shared.config import Settings
from tests.helpers import in_process_gateway


@pytest.fixture
async def gateway(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with in_process_gateway(settings) as http:
        yield http
