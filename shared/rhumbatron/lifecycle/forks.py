"""A Candidate's fork: the canonical files with its changesets applied, one JSON file
``<state>/forks/<project>/<candidate>.json``. Verification checks it, a release deploys it,
and ``forks.sweep`` and ``project.cleanup`` delete the forks nobody can promote any more."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rhumbatron.paths import path_under

__all__ = ["ForkStore"]


@dataclass
class ForkStore:
    """A Candidate's fork: the canonical files with its changesets applied, one JSON file
    ``<state>/forks/<project>/<candidate>.json``. Verification checks it and a release
    deploys it; ``forks.sweep`` deletes the forks nobody can promote any more."""

    root: Path

    def path(self, project_id: str, candidate_id: str) -> Path:
        """The fork's file; refuses a name that would lead outside ``root``."""
        return path_under(self.root, project_id, f"{candidate_id}.json")

    def write(self, project_id: str, candidate_id: str, files: dict[str, str]) -> Path:
        path = self.path(project_id, candidate_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(files, sort_keys=True), encoding="utf-8")
        partial.replace(path)  # atomic: a reader never sees half a fork
        return path

    def read(self, project_id: str, candidate_id: str) -> dict[str, str] | None:
        path = self.path(project_id, candidate_id)
        if not path.exists():
            return None
        files: dict[str, str] = json.loads(path.read_text(encoding="utf-8"))
        return files

    def forks(self, project_id: str | None = None) -> list[tuple[str, str]]:
        """``(project, candidate)`` of every fork, sorted."""
        if not project_id:
            found = self.root.glob("*/*.json")
        else:
            found = path_under(self.root, project_id).glob("*.json")
        return sorted((p.parent.name, p.stem) for p in found)

    def delete(self, project_id: str, candidate_id: str) -> bool:
        path = self.path(project_id, candidate_id)
        if not path.exists():
            return False
        path.unlink()
        return True

    def has_forks(self, project_id: str) -> bool:
        """Whether any fork of ``project_id`` is left."""
        return any(path_under(self.root, project_id).glob("*.json"))
