"""``celery-ha enqueue --sitemap``: counts, filters, lastmod on a later run, and one-line errors, against a
real HTTP server serving generated sitemaps and a real Redis."""

from __future__ import annotations

import json
import os
import pty
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from celery_ha import TaskQueue
from celery_ha.state import task_id_for
from tests.support.cli import SECRET, assert_one_line_error, run
from tests.support.sitemap_site import Route, SitemapSite, index, urlset


@pytest.fixture
def site() -> Iterator[SitemapSite]:
    s = SitemapSite().start()
    u = s.url
    lastmod: dict[int, str] = {}
    s.lastmod = lastmod  # type: ignore[attr-defined]  (a test changes a page's lastmod between runs)
    s.routes["/robots.txt"] = Route(lambda: [f"Sitemap: {u}/index.xml\nsitemap: {u}/news.xml\n".encode()],
                                    content_type="text/plain")
    s.routes["/index.xml"] = Route(lambda: index([f"{u}/shop.xml.gz", f"{u}/blog.xml.gz"]))
    s.routes["/shop.xml.gz"] = Route(lambda: urlset((f"{u}/shop/{i}", lastmod.get(i, "2021-05-01"))
                                                    for i in range(300)), gzip=True)
    s.routes["/blog.xml.gz"] = Route(lambda: urlset((f"{u}/blog/{i}", None) for i in range(100)), gzip=True)
    s.routes["/news.xml"] = Route(lambda: urlset((f"{u}/news/{i}", "2021-05-01") for i in range(50)),
                                  content_encoding=True)
    yield s
    s.stop()


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url)


def cli(redis_url: str, *args: str):
    return run(["--redis-url", redis_url, *args])


def test_sitemap_counts_and_a_later_run_skips_unchanged_pages(redis_url: str, q: TaskQueue,
                                                              site: SitemapSite) -> None:
    result = cli(redis_url, "enqueue", "--sitemap", site.url, "--batch-size", "100")
    assert result.exit_code == 0, result.output
    assert "queued 450 new task(s) (0 changed since they finished), 0 duplicate(s), 0 unchanged, " \
           "0 filtered, 0 invalid, from 5 document(s)" in result.stdout
    assert q.stats()["queued"] == 450
    for _ in range(320):  # the worker side: the shop pages and 20 blog posts finish
        lease = q.claim_next("w:1")
        q.complete(lease)
    site.lastmod[5] = datetime.fromtimestamp(time.time() + 60, tz=timezone.utc).isoformat()
    result = cli(redis_url, "enqueue", "--json", "--sitemap", f"{site.url}/robots.txt", "--no-pump")
    out = json.loads(result.stdout)
    assert {k: out[k] for k in ("seen", "new", "changed", "duplicates", "unchanged", "filtered")} == {
        "seen": 450, "new": 1, "changed": 1, "duplicates": 100 + 50, "unchanged": 299, "filtered": 0}
    # The 20 finished blog posts have no lastmod: plain dedup (no recrawl window here) keeps them out.
    assert q.get(task_id_for("fetch_page", f"{site.url}/shop/5")).state == "queued"
    assert q.get(task_id_for("fetch_page", f"{site.url}/shop/6")).state == "completed"


def test_sitemap_filters(redis_url: str, q: TaskQueue, site: SitemapSite) -> None:
    result = cli(redis_url, "enqueue", "--json", "--sitemap", f"{site.url}/index.xml",
                 "--sitemap", f"{site.url}/news.xml", "--include", "*/shop/*", "--include", "*/news/*",
                 "--exclude", "*/shop/1*")
    out = json.loads(result.stdout)
    assert out["new"] == 300 - 111 + 50 and out["filtered"] == 100 + 111, out
    assert q.stats()["queued"] == 239


def test_sitemap_errors_are_one_line(redis_url: str, q: TaskQueue, site: SitemapSite) -> None:
    assert_one_line_error(cli(redis_url, "enqueue", "--sitemap", "ftp://x.test/s.xml"), code=2,
                          contains="--sitemap")
    assert_one_line_error(cli(redis_url, "enqueue", "--sitemap", site.url, "https://x.test/a"), code=2)
    assert_one_line_error(cli(redis_url, "enqueue", "https://x.test/a", "--include", "*"), code=2)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    line = assert_one_line_error(cli(redis_url, "enqueue", "--sitemap",
                                     f"http://user:{SECRET}@127.0.0.1:{port}/sitemap.xml"), code=1)
    assert "cannot fetch" in line and "***" in line
    assert_one_line_error(cli(redis_url, "enqueue", "--sitemap", f"{site.url}/gone.xml"), code=1,
                          contains="HTTP 404")

    u = site.url

    def broken() -> Iterator[bytes]:
        yield from list(urlset(((f"{u}/b/{i}", None) for i in range(450)), per_chunk=50))[:-1]
        yield b"<url><loc>http://x.test/</loc><lastmod>"  # cut off mid-document

    site.routes["/broken.xml"] = Route(broken)
    line = assert_one_line_error(cli(redis_url, "enqueue", "--sitemap", f"{u}/broken.xml",
                                     "--batch-size", "200"), code=1, contains="not well-formed")
    assert "complete batches stay queued" in line and "400 new" in line
    assert q.stats()["queued"] == 400  # two complete batches; the unfinished one of 50 is not queued


def test_an_unreadable_lastmod_does_not_stop_the_ingestion(redis_url: str, q: TaskQueue,
                                                           site: SitemapSite) -> None:
    """A zone of +24:00 (there is none) is read as no lastmod: all 250 pages are queued, exit 0."""
    u = site.url
    site.routes["/zones.xml"] = Route(lambda: urlset(
        (f"{u}/z/{i}", "2024-01-01T10:00:00+24:00" if i == 150 else "2024-01-01") for i in range(250)))
    result = cli(redis_url, "enqueue", "--json", "--sitemap", f"{u}/zones.xml", "--batch-size", "100")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert (out["new"], out["invalid"]) == (250, 0), out
    assert q.stats()["queued"] == 250


def test_help_documents_sitemaps(redis_url: str) -> None:
    text = cli(redis_url, "enqueue", "--help").stdout
    assert "--sitemap URL" in text and "--include GLOB" in text and "lastmod" in text


@pytest.mark.skipif(not sys.platform.startswith(("linux", "darwin")), reason="needs a pty")
def test_running_counts_on_a_terminal_stderr_only(redis_url: str, site: SitemapSite) -> None:
    """stderr on a terminal shows the running counts; stdout keeps its one line (as with -f)."""
    argv = [sys.executable, "-m", "celery_ha.cli", "--redis-url", redis_url, "enqueue", "--sitemap", site.url,
            "--batch-size", "100"]
    master, slave = pty.openpty()
    seen = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
                              env={**os.environ, "TERM": "xterm"}, timeout=120, check=False)
    finally:
        os.close(slave)
    reader.join(timeout=30)
    os.close(master)
    assert proc.returncode == 0, (proc.stdout, bytes(seen))
    shown = bytes(seen).decode("utf-8", "replace")
    assert "sitemaps: 5 document(s), 450 URL(s): 450 new" in shown, shown
    assert proc.stdout.decode().count("\n") == 1 and proc.stdout.decode().startswith("queued 450 new")
