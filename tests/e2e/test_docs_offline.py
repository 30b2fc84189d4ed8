"""``/docs`` in a real headless Chromium (issue #20): the Swagger UI renders every operation
with every asset served by the API itself — nothing from a CDN, so it works with no way out
(this machine has none) — and without a token."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
import uvicorn

from rhumbatron.api import StaticTokenAuth, create_api
from rhumbatron.core.settings import load_settings
from rhumbatron.mcp_server.tools import operations
from rhumbatron.runtime.bootstrap import bootstrap

from .test_local_dashboard import Browser, chromium  # noqa: F401 (its fixture: skips without)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("chromium")]


async def test_the_docs_page_renders_every_operation_from_the_apis_own_assets(
    tmp_path: Path,
) -> None:
    # GIVEN the API under uvicorn on a loopback port, no token known to the browser
    runtime = bootstrap(load_settings(state_dir=tmp_path / "state"))
    api = create_api(runtime, StaticTokenAuth({}), manage_runtime=False)
    expected = len(operations(api.openapi()))
    listener = socket.create_server(("127.0.0.1", 0))
    origin = f"http://127.0.0.1:{listener.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(api, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    browser = await Browser.launch(tmp_path / "profile", tmp_path / "chromium.log")
    try:
        # WHEN the docs page is opened
        await browser.call("Page.navigate", {"url": f"{origin}/docs"})
        # THEN Swagger UI shows one block per operation of the API
        await browser.until(
            f"document.querySelectorAll('.opblock').length === {expected}",
            f"{expected} operations",
        )
        # AND every resource the page loaded came from the API itself
        loaded = await browser.evaluate(
            "[location.href, ...performance.getEntriesByType('resource').map(e => e.name)]"
        )
        assert loaded and all(url.startswith(origin) for url in loaded), loaded
        assert any(url.endswith("/docs/static/swagger-ui-bundle.js") for url in loaded)
    finally:
        await browser.close()
        server.should_exit = True
        await serving
        await runtime.close()
