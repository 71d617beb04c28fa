"""A site on its own loopback address (127.0.0.x) whose robots.txt the test scripts: its text, its
status, how slowly it answers, redirects; every other path is a small HTML page. The site logs the
arrival of every request (time, path, status, client port), so a test judges robots.txt traffic from
the site's own log."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer

from tests.support.http_site import QuietHandler, serve, stop


@dataclass(frozen=True)
class Arrival:
    at: float  # time.time() when the request arrived
    path: str
    status: int
    port: int  # the client's port: one per connection (a pool process keeps its own)


@dataclass(eq=False)
class RobotsSite:
    """``robots``: the file's text (None: 404); ``robots_status``: another status answers it;
    ``robots_secs``: how long robots.txt takes; ``redirects``: path -> Location (a 301)."""

    address: str = "127.0.0.1"
    robots: str | None = None
    robots_status: int = 200
    robots_secs: float = 0.0
    redirects: dict[str, str] = field(default_factory=dict)
    log: list[Arrival] = field(default_factory=list)
    robots_started: int = 0  # robots.txt requests the site began to answer
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def start(self) -> RobotsSite:
        site = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                arrived = time.time()
                path = self.path.split("?", 1)[0]
                status, body, headers = site._answer(path)
                with site.lock:
                    site.log.append(Arrival(arrived, path, status, self.client_address[1]))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:  # the client stopped reading (a body cut short) and went away
                    self.close_connection = True

        self.server = serve(self.address, Handler, quiet_errors=True)
        return self

    def _answer(self, path: str) -> tuple[int, bytes, dict[str, str]]:
        if path in self.redirects:
            return 301, b"moved", {"Location": self.redirects[path], "Content-Type": "text/plain"}
        if path == "/robots.txt":
            secs = self.robots_secs
            with self.lock:
                self.robots_started += 1  # before it answers (the log has answered requests only)
            time.sleep(secs)  # the site's slowness, in its own request thread
            if self.robots_status != 200:
                return self.robots_status, b"not now", {"Content-Type": "text/plain"}
            if self.robots is None:
                return 404, b"no robots.txt", {"Content-Type": "text/plain"}
            return 200, self.robots.encode(), {"Content-Type": "text/plain"}
        return 200, f"<html><title>{path}</title>page {path}</html>".encode(), {"Content-Type": "text/html"}

    @property
    def host(self) -> str:
        assert self.server is not None
        return f"{self.address}:{self.server.server_port}"

    def url(self, path: str = "/ok") -> str:
        return f"http://{self.host}{path}"

    def urls(self, n: int) -> list[str]:
        return [self.url(f"/p/{i}") for i in range(n)]

    def hits(self, path: str | None = None) -> list[Arrival]:
        with self.lock:
            return [a for a in self.log if path is None or a.path == path]

    def robots_count(self) -> int:
        return len(self.hits("/robots.txt"))

    def pages(self) -> list[Arrival]:
        """Page requests (robots.txt and redirects left out), by arrival."""
        with self.lock:
            return sorted((a for a in self.log if a.path != "/robots.txt" and a.path not in self.redirects),
                          key=lambda a: a.at)

    def close(self) -> None:
        if self.server is not None:
            stop(self.server)
