"""Fixtures of the API tests: the runtime on a real nats-server and a manual clock, and
FastAPI's TestClient over :func:`create_api`.

The TestClient runs the app on an event loop of its own (a portal thread); the runtime's
NATS connection opens lazily there on first use, and the app's shutdown drains it there.
So these tests are synchronous, and never share a runtime between two clients.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from rhumbatron.actors.alarms import RecordingAlarmSink
from rhumbatron.api import StaticTokenAuth, create_api
from rhumbatron.core.clock import ManualClock
from rhumbatron.core.settings import Settings, load_settings
from rhumbatron.domain.facts import Caller
from rhumbatron.runtime.bootstrap import Rhumbatron, bootstrap
from rhumbatron_dev.local.nats_server import NatsServerProcess

from .support import PROJECT, TENANT, TOKENS

with warnings.catch_warnings():
    # Starlette asks for httpx2 over httpx; the client behaves the same with either.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient


@pytest.fixture
def api_settings(tmp_path: Path, nats_server: NatsServerProcess) -> Settings:
    return load_settings(
        state_dir=tmp_path / "state",
        nats_url=nats_server.url,
        api_tokens=TOKENS,
        # An outage is found out quickly: a send fails in a second, not five.
        command_send_timeout_s=1.0,
        nats_connect_timeout_s=0.5,
    )


def make_runtime(settings: Settings, clock: ManualClock) -> Rhumbatron:
    return bootstrap(settings, clock=clock, alarms=RecordingAlarmSink())


def make_client(runtime: Rhumbatron) -> TestClient:
    """A client over a new API on ``runtime``; enter it to start the app (``with``)."""
    api = create_api(runtime, StaticTokenAuth(runtime.settings.api_tokens))
    return TestClient(api, raise_server_exceptions=True)


@pytest.fixture
def runtime(api_settings: Settings, clock: ManualClock) -> Rhumbatron:
    """The runtime, with the tenant's project provisioned (commands need an owner)."""
    app = make_runtime(api_settings, clock)
    owner = Caller(tenant_id=TENANT, actor="user:ann", correlation_id="corr-1")
    app.project_root(PROJECT).create_project(owner, name="Web")
    return app


@pytest.fixture
def client(runtime: Rhumbatron) -> Iterator[TestClient]:
    """The API on ``runtime``, started; its shutdown closes the runtime."""
    with make_client(runtime) as test_client:
        yield test_client
