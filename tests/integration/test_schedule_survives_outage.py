"""A scheduled page whose site goes down (503) for longer than the task's retries ends dead, and is
fetched again once the site is back, by its schedule alone: no operator, no enqueue. A page that
answers 404 ends dead for good. Real prefork worker, real redis-server, a real site on its own
loopback address whose own request log is the judge."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer

import pytest

from tests.support.celery_fixtures import make_cluster  # noqa: F401  (the fixture)
from tests.support.celery_helpers import wait_for
from tests.support.http_site import QuietHandler, serve, stop

pytestmark = pytest.mark.slow


@dataclass(eq=False)
class OutageSite:
    """``/flaky`` answers 503 while ``down`` is set, ``/gone`` 404 once ``removed`` is set (the page
    was deleted), ``/robots.txt`` 404, anything else 200; every request is logged as (time, path,
    status)."""

    address: str = "127.0.0.23"
    down: threading.Event = field(default_factory=threading.Event)
    removed: threading.Event = field(default_factory=threading.Event)
    log: list[tuple[float, str, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def start(self) -> OutageSite:
        site = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                if self.path == "/robots.txt" or (self.path == "/gone" and site.removed.is_set()):
                    status = 404
                elif self.path == "/flaky" and site.down.is_set():
                    status = 503
                else:
                    status = 200
                with site.lock:
                    site.log.append((time.time(), self.path, status))
                body = f"<html><title>{self.path}</title><p>page</p></html>".encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = serve(self.address, Handler)
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://{self.address}:{self.server.server_address[1]}"

    def visits(self, path: str, since: float = 0.0, status: int | None = None
               ) -> list[tuple[float, str, int]]:
        """The requests of ``path`` from ``since`` on (with that status, when given)."""
        with self.lock:
            return [v for v in self.log
                    if v[1] == path and v[0] >= since and (status is None or v[2] == status)]

    def stop(self) -> None:
        if self.server is not None:
            stop(self.server)


@pytest.fixture
def outage_site() -> Iterator[OutageSite]:
    s = OutageSite().start()
    yield s
    s.stop()


def test_a_scheduled_page_is_fetched_again_after_an_outage(make_cluster, outage_site: OutageSite) -> None:  # noqa: F811
    site = outage_site
    cluster = make_cluster()
    q = cluster.q
    q.set_schedule("fetch_page", every=2)
    cluster.worker("w1", concurrency=2)
    ok, flaky, gone = q.enqueue_many([site.url + "/ok", site.url + "/flaky", site.url + "/gone"],
                                     task="fetch_page")
    cluster.pump()
    wait_for(lambda: len(site.visits("/flaky", status=200)) >= 2 and len(site.visits("/gone")) >= 2,
             timeout=90, message="two visits of /flaky and /gone")

    site.removed.set()  # /gone answers 404 from now: a permanent failure ends its schedule
    site.down.set()  # the outage: /flaky answers 503 until its task has spent every attempt
    t_down = time.time()
    wait_for(lambda: q.get(gone).state == "dead", timeout=60, message="/gone dead at its 404")
    wait_for(lambda: q.get(flaky).state == "dead", timeout=120, message="/flaky dead after its retries")
    assert site.visits("/flaky", since=t_down, status=503) and site.visits("/gone", status=404)
    assert "PermanentFetchError" in (q.get(gone).error or ""), q.get(gone).error
    assert q.stats()["dead"] == 2 and {t.id for t in q.dead()} == {flaky, gone}
    site.down.clear()  # the site is back
    t_up = time.time()

    # The schedule alone brings /flaky back: the site sees it fetched again (200), and again.
    wait_for(lambda: len(site.visits("/flaky", since=t_up, status=200)) >= 2, timeout=90,
             message="/flaky fetched again after the outage, by its schedule")
    assert q.get(flaky).state != "dead"
    stats = q.stats()
    assert stats["dead"] == 1 and [t.id for t in q.dead()] == [gone], stats  # /gone only
    assert stats["redriven"] == 0  # no operator
    # /gone's schedule ended with its 404: not fetched since, while /flaky and /ok went on (/ok on a
    # phase of its own: its second run since the site came back may follow /flaky's).
    wait_for(lambda: len(site.visits("/ok", since=t_up)) >= 2, timeout=30, message="/ok fetched on")
    assert q.get(ok).state != "dead"
    assert len(site.visits("/gone", status=404)) == 1 and not site.visits("/gone", since=t_up)
