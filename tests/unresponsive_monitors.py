"""Monitoring endpoints that do not answer, for the tests of reads that must give up on a
node within their timeout: one that takes the connection and never answers, and one that
answers who it is and then never sends its ``/jsz``."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextlib.contextmanager
def silent_monitor() -> Iterator[str]:
    """A URL whose server takes the connection and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # the kernel completes the handshake; nothing ever reads
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@contextlib.contextmanager
def monitor_stuck_on_jsz() -> Iterator[str]:
    """A monitor that answers ``/varz`` at once and holds every ``/jsz`` until it closes."""
    closing = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/jsz"):
                closing.wait()  # the stuck request: released when the test ends
                return
            body = json.dumps({"server_name": "stuck"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        closing.set()
        server.shutdown()
        server.server_close()
