"""Provisioning and deploying a project's app: the port, and the local stand-in.

In the cloud a platform team plugs in its own provisioner and deployer (a stack, a
container service); locally an app is a directory ``<state>/apps/<project>/<app>/`` and a
release writes the released files there. A provisioner that fails is how the demo shows a
dead-letter round trip: its failures send ``app.provision`` to the dead-letter queue, and an
operator's Retry (the next attempt) succeeds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rhumbatron.errors import AppProvisioningError
from rhumbatron.paths import path_under

__all__ = ["AppDeployer", "AppProvisioner", "LocalApps"]


class AppProvisioner(Protocol):
    async def provision(self, project_id: str, app_name: str, attempt: int) -> None: ...


class AppDeployer(Protocol):
    async def deploy(
        self, project_id: str, app_name: str, generation: int, files: Mapping[str, str]
    ) -> Path: ...


@dataclass
class LocalApps:
    """Apps as directories under ``root``. ``failing_until_attempt`` makes an app's
    provisioning fail for every attempt below the given one (the demo's dead letter)."""

    root: Path
    failing_until_attempt: dict[str, int] = field(default_factory=dict)

    async def provision(self, project_id: str, app_name: str, attempt: int) -> None:
        first_good = self.failing_until_attempt.get(app_name, 1)
        if attempt < first_good:
            raise AppProvisioningError(
                f"app {app_name!r} of project {project_id!r} could not be provisioned on "
                f"attempt {attempt} (the local provisioner is set to fail until attempt "
                f"{first_good}); an operator's Retry sends the next attempt"
            )
        path_under(self.root, project_id, app_name).mkdir(parents=True, exist_ok=True)

    async def deploy(
        self, project_id: str, app_name: str, generation: int, files: Mapping[str, str]
    ) -> Path:
        app_dir = path_under(self.root, project_id, app_name)
        target = app_dir / f"generation-{generation}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        partial.write_text(json.dumps(dict(files), sort_keys=True), encoding="utf-8")
        partial.replace(target)
        (app_dir / "live.txt").write_text(f"{generation}\n")
        return target
