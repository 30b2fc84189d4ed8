"""moto's S3 server on loopback: the archive's embedded default (no account, no Docker)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from rhumbatron.errors import LocalStackError
from rhumbatron_dev.local.nats_server import free_port

__all__ = ["S3ServerProcess"]


@dataclass
class S3ServerProcess:
    """moto's threaded S3 server on 127.0.0.1, with a helper to make an S3 client for it."""

    port: int = field(default_factory=free_port)
    _server: Any = field(default=None, init=False, repr=False)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> None:
        import logging

        from moto.server import ThreadedMotoServer  # heavy import: only when a stack starts

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request

        if self._server is not None:
            return
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.endpoint_url + "/moto-api/", timeout=1):
                    return
            except urllib.error.HTTPError:
                return  # any HTTP answer means the server is up
            except (urllib.error.URLError, OSError):
                time.sleep(0.02)  # polling a server coming up, not synchronising a test
        raise LocalStackError(f"moto S3 server on port {self.port} did not answer in {timeout_s}s")

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def client(self) -> Any:
        """A boto3 S3 client pointed at this server, with dummy credentials."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )
