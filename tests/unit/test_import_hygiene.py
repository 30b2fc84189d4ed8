"""Cold starts, kept honest without timing: what each handler module imports.

Lambda's caller waits for a cold container's init, and most of it is importing the handler
module. ``bench/cold_start.py`` times it; these tests pin the cause instead: each
``functions/<role>/app.py`` is imported in a fresh interpreter (the function's folder as the
working directory, as Lambda's ``/var/task``; no ``RHUMBATRON_*`` settings), and the child
reports ``sys.modules``. A heavy module that creeps onto a handler's import path — boto3, the
Anthropic client, FastAPI outside the API, the whole message registry — fails here, naming
the function and the module, whatever the machine's speed. The child also refuses every
socket connect: importing a handler must not touch the network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FUNCTIONS = Path(__file__).resolve().parents[2] / "functions"
ROLES = sorted(p.parent.name for p in FUNCTIONS.glob("*/app.py"))
API_ROLE = "api"

#: Imported only where used, never by a handler module: the SDKs of the cloud and the LLM,
#: NATS (connected on the first invocation), HTTP clients; and the operator CLI with typer and
#: rich, which no handler needs (the dependency layer does not even hold them).
NEVER_AT_IMPORT = (
    "anthropic",
    "boto3",
    "nats",
    "httpx",
    "sqlite_utils",
    "rhumbatron.cli",
    "typer",
    "rich",
)
#: What only the operator API needs: the web framework, its adapter, JWTs.
API_ONLY = ("fastapi", "starlette", "mangum", "jwt")
#: The package's own heavy parts a role reaches only from its handler's body: the message
#: registry (every envelope and payload model) for the roles that validate small events at
#: the edge; the indexing and router packages for the API, whose routes do not build them.
#: The message registry's modules (``rhumbatron.protocol.ids`` is a leaf with no models).
MESSAGE_REGISTRY = (
    "rhumbatron.protocol.envelopes",
    "rhumbatron.protocol.event_types",
    "rhumbatron.protocol.command_types",
    "rhumbatron.protocol.payloads",
)
DEFERRED_PACKAGES = {
    "queue": (*MESSAGE_REGISTRY, "rhumbatron.runtime.bootstrap", "rhumbatron.actors"),
    API_ROLE: ("rhumbatron.indexing", "rhumbatron.router", "rhumbatron.metrics.analytics"),
}

# The child: refuse the network, import the handler module, report sys.modules and any
# connect that was attempted.
_CHILD = """
import importlib, json, socket, sys

attempts = []

def refuse(self, address):
    attempts.append(repr(address))
    raise OSError(f"no network at import: connect to {address!r}")

socket.socket.connect = refuse
socket.socket.connect_ex = refuse
importlib.import_module("app")
print(json.dumps({"modules": sorted(sys.modules), "connects": attempts}))
"""


def _import_in_fresh_interpreter(role: str) -> dict[str, list[str]]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RHUMBATRON_", "POWERTOOLS_", "PYTHON"))
    }
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        cwd=FUNCTIONS / role,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"importing functions/{role}/app.py failed:\n{done.stderr}"
    report: dict[str, list[str]] = json.loads(done.stdout)
    return report


def _loaded(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    """The packages of ``packages`` that ``modules`` holds (the package or any submodule)."""
    return [
        package
        for package in packages
        if any(m == package or m.startswith(package + ".") for m in modules)
    ]


def _forbidden(role: str) -> tuple[str, ...]:
    if role == API_ROLE:
        return (*NEVER_AT_IMPORT, *DEFERRED_PACKAGES[API_ROLE])
    return (*NEVER_AT_IMPORT, *API_ONLY, *DEFERRED_PACKAGES["queue"])


def test_every_function_folder_is_checked() -> None:
    # GIVEN the functions/ folder
    # WHEN its roles are listed
    # THEN the API and the other roles are all there (a moved folder would silence the rest)
    assert API_ROLE in ROLES
    assert {"outbox_publisher", "router_nudge", "sweep", "workflow_step"} <= set(ROLES)
    assert len(ROLES) >= 9, ROLES


@pytest.mark.parametrize("role", ROLES)
def test_importing_a_handler_loads_none_of_the_modules_it_uses_only_when_invoked(
    role: str,
) -> None:
    # GIVEN the function's handler module and what it must not import before an invocation
    forbidden = _forbidden(role)

    # WHEN it is imported in a fresh interpreter, as a cold start does
    report = _import_in_fresh_interpreter(role)

    # THEN none of those modules is loaded, and nothing tried to connect
    assert "app" in report["modules"]
    assert _loaded(report["modules"], forbidden) == [], (
        f"functions/{role}/app.py imports these at import time; import them where they are "
        f"used (inside the function, or under TYPE_CHECKING)"
    )
    assert report["connects"] == []


def test_the_api_imports_its_web_framework_and_the_queue_roles_do_not() -> None:
    # GIVEN the API's handler and a queue consumer's
    # WHEN each is imported in a fresh interpreter
    api = _import_in_fresh_interpreter(API_ROLE)["modules"]
    queue = _import_in_fresh_interpreter("integration")["modules"]

    # THEN FastAPI is the API's (its routes are declared at import) and only the API's
    assert _loaded(api, ("fastapi",)) == ["fastapi"]
    assert _loaded(queue, ("fastapi",)) == []
