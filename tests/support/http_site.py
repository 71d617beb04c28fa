"""The scaffolding the tests' small HTTP sites share: a quiet HTTP/1.1 handler and a threaded server on
one loopback address, started in a daemon thread."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 (keep-alive, as real sites), no access log on stderr."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *_: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    quiet_errors = False

    def handle_error(self, request: object, client_address: object) -> None:
        if not self.quiet_errors:
            super().handle_error(request, client_address)  # type: ignore[arg-type]


def serve(host: str, handler: type[BaseHTTPRequestHandler], *,
          quiet_errors: bool = False) -> ThreadingHTTPServer:
    """Serve ``handler`` on ``host`` at a free port until :func:`stop`. ``quiet_errors``: a client that
    stops reading (a refused document) resets the connection, which is not worth a traceback."""
    server = _Server((host, 0), handler)
    server.quiet_errors = quiet_errors
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()
