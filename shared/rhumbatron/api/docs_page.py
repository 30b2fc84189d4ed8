"""``/docs``: the API's Swagger UI, served from the package, never from a CDN.

FastAPI's own page loads Swagger UI's script and style from a CDN, so it is blank on a
machine with no way out, and an API Gateway that only lets through its own routes. Here the
assets ship with ``fastapi-offline`` and are served under ``/docs/static``. The page and the
OpenAPI document need no token (every operation still does); in the cloud the template
routes them past the JWT authorizer.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

__all__ = ["DOCS_ASSETS", "DOCS_STATIC", "install_docs_page"]

DOCS_STATIC = "/docs/static"
#: The files the page loads, and the only ones served: the package holds more (ReDoc's
#: script), and a public route serves exactly what the page needs.
DOCS_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon.png": "image/png",
}


def _assets() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


def install_docs_page(api: FastAPI) -> None:
    """Serve ``/docs`` (Swagger UI over ``api``'s OpenAPI document) and its assets."""
    assets = _assets()

    @api.get(DOCS_STATIC + "/{name}", include_in_schema=False)
    async def docs_asset(name: str) -> FileResponse:
        media_type = DOCS_ASSETS.get(name)
        if media_type is None:
            raise HTTPException(status_code=404, detail=f"no docs asset {name!r}")
        return FileResponse(assets / name, media_type=media_type)

    @api.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{api.openapi_url}",
            title=f"{api.title} — Swagger UI",
            swagger_js_url=f"{root}{DOCS_STATIC}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_STATIC}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_STATIC}/favicon.png",
        )
