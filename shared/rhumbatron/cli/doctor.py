"""``rhumbatron doctor [--json]``: check what the deployment (or the local stack) needs, one
check a line, each failing one with what to do (:mod:`rhumbatron.operator.doctor`).

Exit status: 0 when no check failed (warnings allowed), 1 when one did.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from rhumbatron.cli.common import EXIT_ERROR, run_on_runtime
from rhumbatron.cli.options import JsonFlag

if TYPE_CHECKING:
    from rhumbatron.operator.doctor import DoctorCheck
    from rhumbatron.runtime.bootstrap import Rhumbatron

__all__ = ["doctor", "doctor_command"]

_MARK = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}


def doctor_command(json_: JsonFlag = False) -> int:
    """Check NATS and durability, the streams, S3, the state directory, the settings and the
    credentials, and say what to fix. Exit status 1 when a check failed."""
    return doctor(argparse.Namespace(json=json_))


def doctor(args: argparse.Namespace) -> int:
    """Run every check; print them; exit 1 when one failed."""
    from rhumbatron.operator.doctor import diagnose

    async def run(app: Rhumbatron) -> list[DoctorCheck]:
        return await diagnose(app)

    checks = run_on_runtime(run)
    if args.json:
        print(json.dumps([check.as_json() for check in checks], indent=2))
    else:
        for check in checks:
            print(f"{_MARK[check.status]}  {check.name}: {check.detail}")
            if check.fix:
                print(f"      fix: {check.fix}")
    return EXIT_ERROR if any(check.status == "fail" for check in checks) else 0
