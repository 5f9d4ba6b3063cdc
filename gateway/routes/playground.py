"""The browser playground: one static page at `GET /` and its assets under `/playground/`.

GET only: `POST /` belongs to the TGI-compatible routes.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from starlette.exceptions import HTTPException

STATIC = Path(__file__).resolve().parent.parent / "static"
ASSETS = {"playground.js": "text/javascript", "playground.css": "text/css"}
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    # The page loads nothing but its own files, and talks to nothing but this gateway.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; base-uri 'none'; "
    "frame-ancestors 'none'",
}

router = APIRouter(tags=["playground"], include_in_schema=False)


@router.get("/")
async def playground_page() -> FileResponse:
    """The playground page."""
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/playground/{name}")
async def playground_asset(name: str) -> FileResponse:
    """One of the page's scripts or stylesheets; nothing else from the folder."""
    media_type = ASSETS.get(name)
    if media_type is None:
        raise HTTPException(404, f"no playground asset {name!r}")
    return FileResponse(STATIC / name, media_type=f"{media_type}; charset=utf-8", headers=HEADERS)
