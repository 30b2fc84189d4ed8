"""``rhumbatron up`` in a real headless Chromium (Debian's ``chromium``): the dashboard loads,
its panels show a short run's metrics, and its Retry button brings a dead letter back.

The browser is driven over the Chrome DevTools Protocol on ``--remote-debugging-pipe`` (NUL-
separated JSON on file descriptors 3 and 4): no port to race for, and no WebSocket library
to add. The run is real: nats-server and moto's S3 on loopback, SQLite files, every role on
its schedule in ``run_up``'s event loop, the page polling the server every 2 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.support import poison_letter
from rhumbatron.lifecycle.commands import lifecycle_command
from rhumbatron.product.dead_letters import command_dead_letter_id, get_dead_letter
from rhumbatron_dev.local.up import UpHandle, run_up

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium")
PROJECT, TENANT, APP = "dash-shop", "acme", "web"
APP_COMMAND = f"cmd_app.provision_{PROJECT}_{APP}"
#: Bound on each wait for the page; the whole test stays well under 30 s.
WAIT_S = 15.0


class Browser:
    """Headless Chromium and one page, driven over CDP on a pipe."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        reader: asyncio.StreamReader,
        writer: asyncio.WriteTransport,
    ) -> None:
        self.process = process
        self._reader = reader
        self._writer = writer
        self._next_id = 0
        self._session: str | None = None
        #: Uncaught exceptions of the page's script, for failure messages.
        self.page_errors: list[str] = []

    @classmethod
    async def launch(cls, profile: Path, log: Path, *, args: Sequence[str] = ()) -> Browser:
        """Chromium with a blank page, ``args`` added to its command line."""
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        # Chromium reads commands on fd 3 and writes answers on fd 4; bash puts the pipe
        # ends there before it becomes chromium (dash takes single-digit fds only).
        process = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w}',
            CHROMIUM or "chromium",
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-pipe",
            f"--user-data-dir={profile}",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            *args,
            "about:blank",
            pass_fds=(to_browser_r, from_browser_w),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=log.open("wb"),
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=16 * 1024 * 1024)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(from_browser_r, "rb", 0)
        )
        writer, _ = await loop.connect_write_pipe(
            asyncio.Protocol, os.fdopen(to_browser_w, "wb", 0)
        )
        browser = cls(process, reader, writer)
        targets = await browser.call("Target.getTargets")
        page = next(t for t in targets["targetInfos"] if t["type"] == "page")
        attached = await browser.call(
            "Target.attachToTarget", {"targetId": page["targetId"], "flatten": True}
        )
        browser._session = attached["sessionId"]
        await browser.call("Runtime.enable")
        return browser

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one CDP command (to the page once attached) and return its result."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if self._session is not None:
            message["sessionId"] = self._session
        self._writer.write(json.dumps(message).encode() + b"\0")
        while True:
            raw = await asyncio.wait_for(self._reader.readuntil(b"\0"), WAIT_S)
            answer = json.loads(raw[:-1])
            if answer.get("method") == "Runtime.exceptionThrown":
                details = answer["params"]["exceptionDetails"]
                self.page_errors.append(
                    details.get("exception", {}).get("description") or details["text"]
                )
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise AssertionError(f"CDP {method} failed: {answer['error']}")
                result: dict[str, Any] = answer["result"]
                return result

    async def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` in the page (JSON-able values only; a promise's once it
        settles)."""
        result = await self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression} threw {result['exceptionDetails']}")
        return result["result"].get("value")

    async def until(self, expression: str, what: str) -> Any:
        """Evaluate ``expression`` until it is truthy; fail naming ``what`` after WAIT_S."""
        deadline = time.monotonic() + WAIT_S
        value = None
        while time.monotonic() < deadline:
            value = await self.evaluate(expression)
            if value:
                return value
            # Bounded polling of the page: the page itself polls the server every 2 s.
            await asyncio.sleep(0.1)
        status = await self.evaluate("document.getElementById('status')?.textContent")
        raise AssertionError(
            f"the page never showed {what} within {WAIT_S:g} s (last value {value!r}, status "
            f"{status!r}, script errors {self.page_errors})"
        )

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self._session = None
            await asyncio.wait_for(self.call("Browser.close"), 5)
        try:
            await asyncio.wait_for(self.process.wait(), 5)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        self._writer.close()


@contextlib.asynccontextmanager
async def running_up(root: Path) -> AsyncIterator[UpHandle]:
    """``run_up`` on free ports in this event loop, its app provisioner failing attempt 1."""
    ready: asyncio.Future[UpHandle] = asyncio.get_running_loop().create_future()

    def on_ready(handle: UpHandle) -> None:
        # Before any role runs: the provisioner reads its failures when first built.
        handle.app.lifecycle().failing_apps = {APP: 2}
        ready.set_result(handle)

    task = asyncio.create_task(
        run_up(
            root,
            duration_s=60,  # a bound only: the test stops it
            on_ready=on_ready,
            # The failing command walks its retries at once (deployed: 30 s apart).
            settings_overrides={"queue_retry_delay_s": {"integration": 0.0}},
            out=io.StringIO(),
        )
    )
    starting: set[asyncio.Future[Any]] = {task, ready}
    done, _ = await asyncio.wait(starting, timeout=WAIT_S, return_when="FIRST_COMPLETED")
    if task in done:
        task.result()  # run_up failed to start: show why
    assert ready in done, "run_up did not get ready"
    handle = ready.result()
    try:
        yield handle
    finally:
        handle.stop()
        await asyncio.wait_for(task, 20)


@pytest.fixture
def chromium() -> str:
    if CHROMIUM is None:
        pytest.skip(
            "Debian's chromium is not installed: `make test` installs it as root "
            "(apt-get install -y --no-install-recommends chromium); the browser test needs it"
        )
    return CHROMIUM


async def test_the_dashboard_shows_a_short_run_and_its_retry_closes_the_dead_letter(
    chromium: str, tmp_path: Path
) -> None:
    async with running_up(tmp_path / "up") as up:
        browser = await Browser.launch(tmp_path / "profile", tmp_path / "chromium.log")
        try:
            # GIVEN the dashboard of a run that has not failed anything yet
            await browser.call("Page.navigate", {"url": up.dashboard_url})
            # THEN its dead letters panel says so, instead of showing an empty table
            empty = await browser.until(
                "document.querySelector('#dead-letter-rows tr[data-empty]')?.textContent",
                "the dead letters' empty state",
            )
            assert empty == "No dead letters: nothing has failed for good."
            # GIVEN a project provisioned, and an app whose first attempt fails into the
            # dead-letter queue, sent as a producer sends them
            lifecycle = up.app.lifecycle()
            now = up.app.clock.now()
            for command in (
                lifecycle_command(
                    "project.provision",
                    f"cmd_project.provision_{PROJECT}",
                    project_id=PROJECT,
                    now=now,
                    payload={"name": "Dashboard shop", "tenantId": TENANT},
                ),
                lifecycle_command(
                    "app.provision",
                    APP_COMMAND,
                    project_id=PROJECT,
                    now=now,
                    payload={"appName": APP},
                ),
            ):
                await lifecycle.sender.send(command)
            letter_id = command_dead_letter_id(APP_COMMAND)
            # AND an event a subscription gave up on: a letter that can only be dismissed
            poison = poison_letter(up.app, tenant=TENANT)
            # WHEN the dashboard shows them

            # THEN its panels show the run: 40 lag cells (5 consumers x 8 streams), the
            # published outbox rows, the open dead letter, the commands, the roles, the feed
            await browser.until(
                "document.querySelectorAll('#lag-rows td[data-stream]').length === 40",
                "a lag cell per consumer and stream",
            )
            await browser.until(
                "Number(document.getElementById('backlog-published').textContent) > 0",
                "published outbox rows",
            )
            await browser.until(
                "document.getElementById('capacity-binding').textContent === "
                "'1,000 (pruneEventsPerDay)'",
                "the lowest ceiling at the default sizing",
            )
            assert (
                await browser.evaluate("document.getElementById('capacity-expected').textContent")
                == "1,000"
            )
            row = f'#dead-letter-rows tr[data-letter-id="{letter_id}"]'
            await browser.until(
                f'document.querySelector(\'{row}[data-status="open"] '
                'button[data-action="retry"]\') !== null',
                f"letter {letter_id} open with a Retry button",
            )
            assert (
                await browser.evaluate("document.getElementById('dead-letters-open').textContent")
                == "2"
            )
            assert (
                await browser.evaluate(
                    "document.querySelector('#dead-letter-count-rows "
                    'tr[data-queue="integration"][data-kind="command"]\').dataset.count'
                )
                == "1"
            )
            # ... the poison event offers Dismiss and no Retry (the API would refuse it)
            poisoned = f'#dead-letter-rows tr[data-letter-id="{poison}"]'
            buttons = await browser.evaluate(
                f"[...document.querySelectorAll('{poisoned} button')].map((b) => b.dataset.action)"
            )
            assert buttons == ["dismiss"]

            # WHEN the operator clicks its Dismiss and declines the question
            await browser.evaluate(
                "window.asked = [];"
                "window.confirm = (m) => { window.asked.push(m); return false; };"
                f"document.querySelector('{poisoned} button[data-action=\"dismiss\"]').click()"
            )
            # THEN the page asked, and nothing was sent: the letter is still open
            assert await browser.evaluate("window.asked") == [
                f"Dismiss {poison}? It closes for good and cannot be retried after."
            ]
            assert get_dead_letter(up.app.product().connection, poison).status.value == "open"
            # WHEN the operator clicks it again and confirms
            await browser.evaluate(
                "window.confirm = () => true;"
                f"document.querySelector('{poisoned} button[data-action=\"dismiss\"]').click()"
            )
            # THEN it is dismissed
            await browser.until(
                f"document.querySelector('{poisoned}[data-status=\"closed\"]') !== null",
                f"letter {poison} closed",
            )
            assert (
                await browser.evaluate("document.getElementById('dead-letters-open').textContent")
                == "1"
            )
            deliveries = await browser.until(
                "Number(document.querySelector('#command-rows "
                'tr[data-queue="integration"]\').dataset.deliveries)',
                "deliveries on the integration queue",
            )
            assert deliveries >= 5  # the project, then the app: 1 + 3 deliveries
            await browser.until(
                "Number(document.querySelector('#role-rows tr[data-role=\"queue:integration\"]')"
                "?.dataset.ticks) > 0",
                "the integration consumer's ticks",
            )
            await browser.until(
                "document.querySelector('#feed-rows tr[data-event-type=\"project.created\"]') "
                "!== null",
                "project.created in the event feed",
            )

            # WHEN the operator clicks Retry
            await browser.evaluate(
                f"document.querySelector('{row} button[data-action=\"retry\"]').click()"
            )

            # THEN the page shows the Retry sent, then the letter closed as succeeded
            result = await browser.until(
                f"document.querySelector('{row}')?.dataset.actionResult",
                "what the Retry answered",
            )
            assert result == "retried: sent attempt 2"
            await browser.until(
                f'document.querySelector(\'{row}[data-status="closed"]'
                '[data-resolution="succeeded"]\') !== null',
                f"letter {letter_id} closed as succeeded",
            )
            assert (
                await browser.evaluate("document.getElementById('dead-letters-open').textContent")
                == "0"
            )
            assert browser.page_errors == []
        finally:
            await browser.close()

        # AND the product database holds the letter closed by its retried attempt
        letter = get_dead_letter(up.app.product().connection, letter_id)
        assert (letter.status.value, letter.resolution, letter.retried_attempt) == (
            "closed",
            "succeeded",
            2,
        )
        assert up.stats.roles["queue:integration"].errors == 0


async def test_the_dashboard_answers_only_loopback_hosts_and_the_runs_token(
    tmp_path: Path,
) -> None:
    # GIVEN `up` running
    async with running_up(tmp_path / "up") as up, httpx.AsyncClient(base_url=up.url) as http:
        auth = {"Authorization": f"Bearer {up.token}"}

        # WHEN the page and its data are asked for, as the page does and otherwise
        page = await http.get("/dashboard")
        summary = await http.get("/dashboard/api/summary", headers=auth)
        no_token = await http.get("/dashboard/api/summary")
        other_host = await http.get("/dashboard", headers={"Host": "rebound.example:80"})
        no_project = await http.get("/dashboard/api/feed?project=nope", headers=auth)
        schema = (await http.get("/openapi.json")).json()

        # THEN the page carries the run's token, runs only its own script, is never cached
        assert page.status_code == 200
        assert f'<meta name="rhumbatron-api-token" content="{up.token}">' in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["cache-control"] == "no-store"
        # AND the data needs the token, and every panel has its data
        assert summary.status_code == 200
        body = summary.json()
        assert len(body["lags"]["rows"]) == 40
        assert set(body["outbox"]) >= {"pending", "retry_wait", "failed"}
        assert body["capacity"]["ceilings"]["archiveEventsPerDay"] == 144_000
        assert body["capacity"]["warnings"] == []
        assert set(body["commands"]["queues"]) == {
            "agent-wakeups",
            "integration",
            "verification",
            "release",
            "indexing",
            "dead-letter",
        }
        assert body["clefFlash"]["calls"] == 0
        assert len(body["throughput"]["eventsPerMinute"]) == 10
        assert no_token.status_code == 401
        # AND a page of another site rebound to 127.0.0.1 is refused, the token with it
        assert other_host.status_code == 403
        assert up.token not in other_host.text
        # AND a mistyped project creates no view: 404
        assert no_project.status_code == 404
        assert not (up.app.settings.state_dir / "projects" / "nope").exists()
        # AND the operator API's schema (the cloud's) has no dashboard route
        assert not [path for path in schema["paths"] if path.startswith("/dashboard")]
