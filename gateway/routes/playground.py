"""The browser playground: one static page at `GET /`, its assets under `/playground/`, and which models
chat (`GET /v1/playground/models`), by which the page opens in Chat mode.

GET only: `POST /` belongs to the TGI-compatible routes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from starlette.exceptions import HTTPException

from gateway.auth import REQUIRE_KEY
from gateway.deps import ServicesDep

STATIC = Path(__file__).resolve().parent.parent / "static"
ASSETS = {"playground.js": "text/javascript", "playground.css": "text/css", "theme.css": "text/css"}
"""The playground's files; `theme.css` is the console's too."""
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    # The page loads nothing but its own files, and talks to nothing but this gateway.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; base-uri 'none'; "
    "frame-ancestors 'none'",
}

router = APIRouter(tags=["playground"], include_in_schema=False)


def static_file(name: str, media_type: str) -> FileResponse:
    """A file of the gateway's pages (the playground's, the console's), with their headers."""
    return FileResponse(STATIC / name, media_type=f"{media_type}; charset=utf-8", headers=HEADERS)


def asset(name: str, assets: Mapping[str, str], page: str) -> FileResponse:
    """One of `page`'s scripts or stylesheets, by name; nothing else from the folder."""
    media_type = assets.get(name)
    if media_type is None:
        raise HTTPException(404, f"no {page} asset {name!r}")
    return static_file(name, media_type)


@router.get("/")
async def playground_page() -> FileResponse:
    """The playground page."""
    return static_file("index.html", "text/html")


@router.get("/playground/{name}")
async def playground_asset(name: str) -> FileResponse:
    """One of the page's scripts or stylesheets."""
    return asset(name, ASSETS, "playground")


@router.get("/v1/playground/models", dependencies=[REQUIRE_KEY])
async def chat_models(services: ServicesDep) -> dict[str, bool]:
    """Each known model by its canonical name: whether its card has a chat template (false while no
    worker of it has published a card)."""
    catalog = await services.admission.catalog()
    cards = {name: await services.admission.prompt_limit.card(name) for name in catalog.entries}
    return {name: card is not None and card.chat_template is not None for name, card in cards.items()}
