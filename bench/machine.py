"""Facts about the machine and software a benchmark ran on."""

from __future__ import annotations

import os
import platform
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from rhumbatron_dev.local.nats_server import find_nats_server_binary

__all__ = ["machine_info"]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _filesystem_of(path: Path) -> str:
    """The mount type holding ``path`` (the temp dir the servers and actor files live in)."""
    target = str(path.resolve())
    best = ("", "unknown")
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    for line in lines:
        parts = line.split()
        if (
            len(parts) >= 3
            and (target == parts[1] or target.startswith(parts[1].rstrip("/") + "/"))
            and len(parts[1]) > len(best[0])
        ):
            best = (parts[1], f"{parts[2]} on {parts[0]}")
    return best[1]


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_info(work_dir: Path) -> dict[str, object]:
    """CPU, memory, OS, Python, nats-py, nats-server, SQLite and the work dir's filesystem."""
    binary = find_nats_server_binary()
    server_version = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count() or 0
    pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    page_size = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0
    return {
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "nproc": affinity,
        "cpu_model": _cpu_model(),
        "memory_gib": round(pages * page_size / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "nats_py": _version("nats-py"),
        "nats_server": server_version,
        "nats_server_binary": binary,
        "sqlite": sqlite3.sqlite_version,
        "pydantic": _version("pydantic"),
        "work_dir_filesystem": _filesystem_of(work_dir),
    }
