"""For tests that run a command as its own process and stop it with a signal: whether a
server of its stack still listens, and how a shell starts a background job."""

from __future__ import annotations

import socket

__all__ = ["IGNORING_SIGINT", "port_open"]

#: ``python -c`` code that execs the rest of its argv with SIGINT ignored, as a shell starts a
#: background job (an exec keeps an ignored signal ignored).
IGNORING_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def port_open(url: str) -> bool:
    """Whether something listens at ``url``'s host and port (``nats://127.0.0.1:4222``)."""
    host, port = url.rsplit("/", 1)[1].split(":")
    with socket.socket() as sock:
        return sock.connect_ex((host, int(port))) == 0
