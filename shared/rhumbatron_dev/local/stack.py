"""The embedded local stack: nats-server + moto S3, started together, stopped cleanly."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from rhumbatron_dev.local.nats_server import NatsServerProcess
from rhumbatron_dev.local.s3_server import S3ServerProcess

__all__ = ["LocalStack"]


@dataclass
class LocalStack:
    """nats-server (JetStream store under ``root/nats``) and an S3 endpoint, on loopback.

    Use as a context manager, or call :meth:`start` / :meth:`stop`. Ports default to free ones.
    """

    root: Path
    nats_port: int | None = None
    s3_port: int | None = None
    sync_interval: str = "2m"
    with_s3: bool = True
    nats: NatsServerProcess = field(init=False)
    s3: S3ServerProcess | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        nats_kwargs: dict[str, object] = {"sync_interval": self.sync_interval}
        if self.nats_port:
            nats_kwargs["port"] = self.nats_port
        self.nats = NatsServerProcess(store_dir=self.root / "nats", **nats_kwargs)  # type: ignore[arg-type]
        if self.with_s3:
            self.s3 = S3ServerProcess(port=self.s3_port) if self.s3_port else S3ServerProcess()

    def start(self) -> Self:
        self.root.mkdir(parents=True, exist_ok=True)
        self.nats.start()
        try:
            if self.s3 is not None:
                self.s3.start()
        except BaseException:
            self.nats.stop()
            raise
        return self

    def stop(self) -> None:
        try:
            if self.s3 is not None:
                self.s3.stop()
        finally:
            self.nats.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
