"""``/docs`` in a real headless Chromium (issue #20): with no way out but to the API on
loopback, and no token, Swagger UI renders every operation, every asset served by the API
itself — nothing from a CDN.

The way out is shut by Chromium's own flags, not by trusting the machine to be offline (this
one reaches some addresses): no host name resolves but the loopback address the API listens
on, and everything not on loopback goes to a proxy that refuses every connection (Chromium
never sends loopback through a proxy).
"""

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

#: A few operations the page must show, by operation ID (Swagger UI's block IDs end in it).
KNOWN_OPERATIONS = ("list_dead_letters", "retry_dead_letter", "send_command", "health")


def _offline(refusing_port: int) -> list[str]:
    """Chromium's flags for a browser that reaches 127.0.0.1 and nothing else."""
    return [
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        f"--proxy-server=http://127.0.0.1:{refusing_port}",
    ]


async def test_the_docs_page_renders_every_operation_offline_from_the_apis_own_assets(
    tmp_path: Path,
) -> None:
    # GIVEN the API under uvicorn on a loopback port, no token known to the browser
    runtime = bootstrap(load_settings(state_dir=tmp_path / "state"))
    api = create_api(runtime, StaticTokenAuth({}), manage_runtime=False)
    expected = len(operations(api.openapi()))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    origin = f"http://127.0.0.1:{port}"
    server = uvicorn.Server(uvicorn.Config(api, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    # AND a browser whose only way out is to that origin (its proxy: a port bound, never
    #   listened on, so every connection to it is refused)
    refusing = socket.socket()
    refusing.bind(("127.0.0.1", 0))
    browser = await Browser.launch(
        tmp_path / "profile", tmp_path / "chromium.log", args=_offline(refusing.getsockname()[1])
    )
    try:
        # WHEN the docs page is opened
        await browser.call("Page.navigate", {"url": f"{origin}/docs"})
        # THEN Swagger UI shows one block per operation of the API, the known ones among them
        await browser.until(
            f"document.querySelectorAll('.opblock').length === {expected}",
            f"{expected} operations",
        )
        shown = await browser.evaluate(
            f"{list(KNOWN_OPERATIONS)}.filter(id => "
            "document.querySelector(`.opblock[id^='operations-'][id$='-${id}']`))"
        )
        assert shown == list(KNOWN_OPERATIONS)
        # AND every resource the page loaded came from the API itself
        loaded = await browser.evaluate(
            "[location.href, ...performance.getEntriesByType('resource').map(e => e.name)]"
        )
        assert loaded and all(url.startswith(origin) for url in loaded), loaded
        assert any(url.endswith("/docs/static/swagger-ui-bundle.js") for url in loaded)
        # AND the way out was shut: the same server under another name is out of reach
        reach = "fetch('{url}', {{mode: 'no-cors'}}).then(() => 'reached', () => 'refused')"
        assert await browser.evaluate(reach.format(url=f"{origin}/health")) == "reached"
        assert await browser.evaluate(reach.format(url=f"http://localhost:{port}/health")) == (
            "refused"
        )
    finally:
        await browser.close()
        refusing.close()
        server.should_exit = True
        await serving
        await runtime.close()
