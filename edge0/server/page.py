"""`GET /`: the live page (plain HTML, CSS and JavaScript shipped in `edge0/server/page/`), under a
strict Content-Security-Policy (docs/server.md, "The page").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

# the page reaches nothing but this server: its own script, style and API
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}
FILES = {  # served name -> media type
    "index.html": "text/html; charset=utf-8",
    "page.css": "text/css; charset=utf-8",
    "page.js": "text/javascript; charset=utf-8",
}


def load() -> dict[str, bytes]:
    """The page's files, read once from the package."""
    folder = resources.files("edge0.server") / "page"
    return {name: (folder / name).read_bytes() for name in FILES}


def weight(files: dict[str, bytes]) -> int:
    """The page's bytes (HTML, CSS and JavaScript together)."""
    return sum(len(b) for b in files.values())


def routes(files: dict[str, bytes]) -> list[Route]:
    """`/` and the page's two assets, from `files` (already in memory: nothing blocks)."""

    def serve(name: str) -> Callable[[Request], Awaitable[Response]]:
        body, media = files[name], FILES[name]

        async def handler(request: Request) -> Response:
            return Response(body, media_type=media, headers=HEADERS)

        handler.__name__ = f"page_{name.replace('.', '_')}"
        return handler

    return [
        Route("/", serve("index.html"), methods=["GET"]),
        Route("/page/page.css", serve("page.css"), methods=["GET"]),
        Route("/page/page.js", serve("page.js"), methods=["GET"]),
    ]
