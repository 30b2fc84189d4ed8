"""Fixtures of the security tests: the API's own (a runtime on a real nats-server with the
tenant's project, and FastAPI's TestClient over it), shared rather than copied."""

from __future__ import annotations

# tests/ is on sys.path (pytest's rootdir insertion), so the API tests' package is `api`.
from api.conftest import api_settings, client, runtime

__all__ = ["api_settings", "client", "runtime"]
