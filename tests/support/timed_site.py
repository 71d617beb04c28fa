"""A slow site that keeps its own log of every request's start and end (its clock, the test machine's).

What a site sees is the judge of politeness: how many requests it had in flight at once, and which
requests reached it at all. The handler logs a request's start as soon as it arrives and its end once
its answer is written, or once writing it failed because the client is gone (a SIGKILLed pool child
closes its socket, but the site goes on answering until its own work is done, as a real one would).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer

from tests.support.http_site import QuietHandler, serve, stop


@dataclass(frozen=True)
class Visit:
    """One request as the site saw it: when it arrived, when its answer was over, which path."""

    start: float
    end: float | None
    path: str


@dataclass(eq=False)
class TimedSite:
    """A site on its own loopback address; each answer takes ``delay`` seconds (a 200 with a small
    HTML page), ``/robots.txt`` answers 404 at once."""

    address: str
    delay: float = 0.0
    visits: list[Visit] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def start(self) -> TimedSite:
        site = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                started = time.time()
                with site.lock:
                    at = len(site.visits)
                    site.visits.append(Visit(started, None, self.path))
                try:
                    if self.path == "/robots.txt":
                        status, body = 404, b"no robots.txt"
                    else:
                        time.sleep(site.delay)  # the site's own work, in its request thread
                        status, body = 200, f"<html><title>{self.path}</title>page</html>".encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    self.wfile.flush()
                except OSError:
                    self.close_connection = True  # the client went away: the request is over all the same
                finally:
                    with site.lock:
                        site.visits[at] = Visit(started, time.time(), self.path)

        self.server = serve(self.address, Handler, quiet_errors=True)
        return self

    @property
    def host(self) -> str:
        assert self.server is not None
        return f"{self.address}:{self.server.server_port}"

    def url(self, path: str) -> str:
        return f"http://{self.host}{path}"

    def log(self) -> list[Visit]:
        """Every request but robots.txt's, by arrival."""
        with self.lock:
            return sorted((v for v in self.visits if v.path != "/robots.txt"), key=lambda v: v.start)

    def in_flight(self) -> list[Visit]:
        """The requests the site is still answering."""
        return [v for v in self.log() if v.end is None]

    def overlaps(self, most: int) -> list[str]:
        """Every moment more than ``most`` requests were in flight at once (at a request's arrival),
        as readable lines naming the requests then in flight."""
        visits = self.log()
        t0 = visits[0].start if visits else 0.0
        out = []
        for v in visits:
            during = [w for w in visits if w.start <= v.start and (w.end is None or w.end > v.start)]
            if len(during) > most:
                out.append(f"@{v.start - t0:.3f}s {len(during)} in flight: " + ", ".join(
                    f"{w.path} [{w.start - t0:.3f}s, "
                    f"{'open' if w.end is None else f'{w.end - t0:.3f}s'}]" for w in during))
        return out

    def close(self) -> None:
        if self.server is not None:
            stop(self.server)
