"""Sitemap reading and ingestion against a real HTTP server (generated sitemaps) and a real Redis."""

from __future__ import annotations

import gc
import socket
import sys
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from celery_ha.base.errors import InvalidInput, TaskNotFound
from celery_ha.fetch.errors import FetchError, PermanentFetchError
from celery_ha.fetch.sitemap import InvalidSitemap, SitemapLimits, SitemapReader, parse_lastmod
from celery_ha.fetch.sitemap_ingest import SitemapIngest, UrlFilter
from celery_ha.redisio.client import redis_client
from celery_ha.state import TaskQueue, task_id_for
from tests.support.sitemap_site import Route, SitemapSite, index, urlset

TASK = "fetch_page"
NAMESPACE = "sm"  # the q fixture's (conftest.py)




def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S+00:00")


def _shop(site: SitemapSite, n: int = 1200, lastmod: dict[int, str] | None = None) -> None:
    """robots.txt -> index -> two gzip urlsets (a .xml.gz file and a Content-Encoding: gzip answer)."""
    u = site.url
    mods = lastmod if lastmod is not None else {}
    robots = f"User-agent: *\nDisallow: /cart\n\nSitemap: {u}/sitemap_index.xml\n".encode()
    site.routes["/robots.txt"] = Route(lambda: [robots], content_type="text/plain")
    site.routes["/sitemap_index.xml"] = Route(lambda: index([f"{u}/products.xml.gz", f"{u}/blog.xml"]))
    site.routes["/products.xml.gz"] = Route(
        lambda: urlset((f"{u}/p/{i}", mods.get(i)) for i in range(n)), gzip=True,
        content_type="application/gzip")
    site.routes["/blog.xml"] = Route(lambda: urlset((f"{u}/blog/{i}", None) for i in range(n // 4)),
                                     content_encoding=True)


def _ingest(q: TaskQueue, urls: list[str], **kw) -> SitemapIngest:
    ingest = SitemapIngest(q, task=TASK, **kw)
    ingest.run(urls)
    return ingest


def test_robots_index_and_two_gzip_urlsets_are_queued_once(site: SitemapSite, q: TaskQueue) -> None:
    _shop(site)
    counts = _ingest(q, [site.url + "/"], batch_size=500).counts
    assert (counts.seen, counts.new, counts.duplicates, counts.documents) == (1500, 1500, 0, 4)
    assert q.stats()["queued"] == 1500
    assert q.get(task_id_for(TASK, f"{site.url}/p/1199")).url == f"{site.url}/p/1199"
    assert q.get(task_id_for(TASK, f"{site.url}/blog/0")).state == "queued"
    assert site.paths() == ["/robots.txt", "/sitemap_index.xml", "/products.xml.gz", "/blog.xml"]
    again = _ingest(q, [site.url + "/robots.txt"]).counts  # a second run: all duplicates
    assert (again.new, again.duplicates) == (0, 1500) and q.stats()["queued"] == 1500


def test_filters_are_globs_on_the_page_url(site: SitemapSite, q: TaskQueue) -> None:
    _shop(site, n=100)
    flt = UrlFilter(include=[f"{site.url}/p/*"], exclude=["*/p/1?", "*/p/5"])
    counts = _ingest(q, [f"{site.url}/sitemap_index.xml"], url_filter=flt).counts
    assert counts.seen == 125 and counts.filtered == 25 + 11 and counts.new == 89
    assert q.get(task_id_for(TASK, f"{site.url}/p/9")).state == "queued"
    for url in (f"{site.url}/p/15", f"{site.url}/p/5", f"{site.url}/blog/1"):
        with pytest.raises(TaskNotFound):
            q.get(task_id_for(TASK, url))


def _id(q: TaskQueue, url: str) -> str:
    """The id ``url``'s task has in ``q`` (a gated sharded namespace places it on its host's shard)."""
    return q.task_ids([{"url": url, "task": TASK}])[0]


def _finish(q: TaskQueue, urls: list[str]) -> None:
    """Claim and complete the tasks of ``urls`` (the real transitions a worker makes)."""
    for url in urls:
        lease = q.claim(_id(q, url), "w:1")
        assert lease is not None
        q.complete(lease)


@pytest.mark.parametrize(("shards", "gate"), [(1, False), (3, False), (3, True)])
def test_lastmod_skips_unchanged_and_requeues_changed_pages(site: SitemapSite, redis_url: str,
                                                            shards: int, gate: bool) -> None:
    # done is read from every shard; with the host gate a sharded namespace places ids by host
    q = TaskQueue(redis_client(redis_url), "sm", shards=shards, host_gate=gate)
    mods = {i: "2020-01-01" for i in range(200)}
    _shop(site, n=200, lastmod=mods)
    first = _ingest(q, [site.url + "/"]).counts
    assert first.new == 250
    _finish(q, [f"{site.url}/p/{i}" for i in range(120)])
    later = _iso(time.time() + 60)
    for i in (3, 7, 150):  # 3 and 7 finished and changed since; 150 is still queued
        mods[i] = later
    second = _ingest(q, [site.url + "/"]).counts
    assert second.changed == 2 and second.new == 2
    assert second.unchanged == 118  # finished, lastmod (2020) older than the completion
    assert second.duplicates == 130  # still queued: /p/120../p/199 and the 50 blog posts (no lastmod)
    for i in (3, 7):
        info = q.get(_id(q, f"{site.url}/p/{i}"))
        assert info.state == "queued"
    assert q.get(_id(q, f"{site.url}/p/4")).state == "completed"
    assert q.stats()["queued"] == 130 + 2
    # An age window still re-queues unchanged pages once they are old enough (here: at once).
    third = _ingest(q, [site.url + "/"], recrawl_after=0).counts
    assert third.unchanged == 0 and third.new == 118


def test_lastmod_is_compared_with_a_completion_a_migration_carried(site: SitemapSite, redis_url: str) -> None:
    """A gated namespace of 1 shard moved to 3: its finished URLs' ids change, so the completion
    times are carried (state/carried.py), and a sitemap's lastmod is still judged against them."""
    from celery_ha.state.migrate import Migration

    old = TaskQueue(redis_client(redis_url), "smg", host_gate=True, history_max=0)
    mods = {i: "2020-01-01" for i in range(10)}
    _shop(site, n=10, lastmod=mods)
    urls = [f"{site.url}/p/{i}" for i in range(10)]
    old.enqueue_many([{"url": u, "task": TASK} for u in urls])
    _finish(old, urls)
    assert Migration(old.client, "smg", "smg3", 3).run().carried == 10
    q = TaskQueue(redis_client(redis_url), "smg3", shards=3, host_gate=True)
    later = _iso(time.time() + 60)
    for i in (3, 7):
        mods[i] = later
    counts = _ingest(q, [f"{site.url}/products.xml.gz"]).counts
    assert (counts.changed, counts.unchanged, counts.new) == (2, 8, 2)
    assert q.stats()["queued"] == 2


def _peak(q: TaskQueue, url: str) -> tuple[int, int]:
    """(tracemalloc peak in bytes while ingesting ``url``, URLs queued)."""
    gc.collect()
    tracemalloc.start()
    try:
        counts = _ingest(q, [url]).counts
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, counts.new


def test_fifty_thousand_urls_in_bounded_memory(site: SitemapSite, q: TaskQueue) -> None:
    """The peak of the test process (HTTP server thread included: it generates as it sends) while a
    50,000-URL gzip sitemap is ingested stays a fraction of what its URL strings alone take, and no
    higher than for a sitemap a tenth of its size: memory follows the batch, not the sitemap."""

    def page(i: int) -> str:
        # Pages on another host than the sitemap's (a CDN-hosted sitemap), in the common simple shape.
        return ("https://shop.example/catalogue/garden-and-outdoor/furniture/benches/"
                f"item-{i:06d}-weatherproof-teak-bench-with-cushion")

    for path, n in (("/small.xml.gz", 5_000), ("/big.xml.gz", 50_000)):
        site.routes[path] = Route(lambda n=n: urlset(((page(i), "2026-01-01") for i in range(n)),
                                                     per_chunk=200), gzip=True)
    held = [page(i) for i in range(50_000)]  # holding every URL at once: the strings alone
    holding = sum(sys.getsizeof(s) for s in held) + sys.getsizeof(held)
    del held
    small_peak, small_new = _peak(q, f"{site.url}/small.xml.gz")
    peak, new = _peak(q, f"{site.url}/big.xml.gz")
    assert (small_new, new) == (5_000, 45_000)  # the small sitemap's pages are the big one's first
    assert q.stats()["queued"] == 50_000
    print(f"peak {peak:,} B (5,000 URLs: {small_peak:,} B); the URL strings alone take {holding:,} B")
    assert holding > 8_000_000
    assert peak < holding / 3, (peak, holding)
    assert peak < small_peak * 1.5 + 256 * 1024, (peak, small_peak)


def test_malformed_document_stops_after_the_complete_batches(site: SitemapSite, q: TaskQueue) -> None:
    u = site.url

    def broken() -> Iterator[bytes]:
        yield from list(urlset((f"{u}/b/{i}", None) for i in range(700)))[:-1]  # no </urlset>
        yield b"<url><loc>http://x.test/</loc></wrong></url>"

    site.routes["/index.xml"] = Route(lambda: index([f"{u}/a.xml", f"{u}/b.xml"]))
    site.routes["/a.xml"] = Route(lambda: urlset((f"{u}/a/{i}", None) for i in range(600)))
    site.routes["/b.xml"] = Route(broken)
    ingest = SitemapIngest(q, task=TASK, batch_size=250)
    with pytest.raises(InvalidSitemap) as err:
        ingest.run([f"{u}/index.xml"])
    message = str(err.value)
    assert "\n" not in message and "not well-formed" in message and "/b.xml" in message
    queued = q.stats()["queued"]
    assert queued == ingest.counts.new and queued % 250 == 0 and 600 <= queued <= 1300, queued
    assert q.get(task_id_for(TASK, f"{u}/a/599")) is not None


def test_bombs_and_limits_are_refused_in_one_line(site: SitemapSite, q: TaskQueue) -> None:
    u = site.url
    laughs = ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
              + "".join(f'<!ENTITY lol{i} "{("&lol%s;" % (i - 1 if i > 1 else "")) * 10}">'
                        for i in range(1, 10))
              + ']><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>&lol9;</loc></url>'
              "</urlset>")
    site.routes["/lol.xml"] = Route(lambda: [laughs.encode()])
    zeros = zlib.compress(b"<urlset>" + b" " * 20_000_000, 9)
    site.routes["/bomb.xml"] = Route(lambda: [zeros], content_encoding=False)
    site.routes["/bomb.xml.gz"] = Route(lambda: [b"<urlset>", b" " * 5_000_000], gzip=True)
    site.routes["/html"] = Route(lambda: [b"<html><body>not a sitemap</body></html>"],
                                 content_type="text/html")
    site.routes["/many.xml"] = Route(lambda: urlset((f"{u}/m/{i}", None) for i in range(120)))
    small = SitemapReader(SitemapLimits(max_bytes=1_000_000, max_urls=100))
    cases = [("/lol.xml", "DOCTYPE"), ("/bomb.xml.gz", "larger than 1,000,000 bytes"),
             ("/html", "root element is <html>"), ("/many.xml", "more than 100 entries")]
    for path, words in cases:
        with pytest.raises(InvalidSitemap) as err:
            list(small.entries([u + path]))
        assert words in str(err.value) and "\n" not in str(err.value), (path, str(err.value))
    with pytest.raises(InvalidSitemap):  # zlib (not gzip) is no sitemap: not well-formed XML
        list(small.entries([u + "/bomb.xml"]))
    assert q.stats()["queued"] == 0


def test_fetch_errors_and_bad_urls(site: SitemapSite, q: TaskQueue) -> None:
    reader = SitemapReader(SitemapLimits(timeout=(2.0, 2.0)))
    with pytest.raises(PermanentFetchError, match="404"):
        list(reader.entries([site.url + "/missing.xml"]))
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(FetchError, match="cannot fetch") as err:
        list(reader.entries([f"http://127.0.0.1:{port}/sitemap.xml"]))
    assert not err.value.permanent
    with pytest.raises(InvalidInput, match="sitemap URL"):
        list(reader.entries(["ftp://example.com/sitemap.xml"]))
    site.routes["/robots.txt"] = Route(lambda: [b"User-agent: *\nDisallow:\n"], content_type="text/plain")
    with pytest.raises(InvalidSitemap, match="no 'Sitemap:' line"):
        list(reader.entries([site.url]))
    # A site that trickles its sitemap is cut off at the time allowed for one document.
    site.routes["/slow.xml"] = Route(lambda: urlset(((f"{site.url}/s/{i}", None) for i in range(1000)),
                                                    per_chunk=5), chunk_delay=0.05)
    with pytest.raises(InvalidSitemap, match="took longer than the time allowed"):
        list(SitemapReader(SitemapLimits(document_seconds=0.5)).entries([site.url + "/slow.xml"]))


def test_resume_skips_documents_before_the_position(site: SitemapSite) -> None:
    _shop(site, n=400)
    reader = SitemapReader()
    everything = list(reader.entries([site.url + "/"]))
    assert len(everything) == 500
    at = everything[450].position  # in blog.xml, the second urlset
    site.hits.clear()
    rest = list(reader.entries([site.url + "/"], resume=list(at)))
    assert [e.url for e in rest] == [e.url for e in everything[451:]]
    assert site.paths() == ["/robots.txt", "/sitemap_index.xml", "/blog.xml"]  # products not re-read


def test_text_sitemaps_off_host_children_and_lastmod_forms(site: SitemapSite, q: TaskQueue) -> None:
    u = site.url
    site.routes["/index.xml"] = Route(lambda: index([f"{u}/list.txt", "http://elsewhere.test/s.xml",
                                                     f"{u}/index.xml", "/relative.xml"]))
    site.routes["/list.txt"] = Route(lambda: [f"{u}/t/1\n\n{u}/t/2\nnot a url\n{u}/t/3".encode()],
                                     content_type="text/plain")
    site.routes["/double.xml.gz"] = Route(lambda: urlset((f"{u}/d/{i}", None) for i in range(3)), gzip=True,
                                          content_encoding=True)  # a .gz sent with Content-Encoding: gzip
    reader = SitemapReader()
    counts = _ingest(q, [f"{u}/index.xml", f"{u}/double.xml.gz"], reader=reader).counts
    assert (counts.new, counts.invalid) == (3 + 3, 1)
    assert reader.skipped_documents == ["http://elsewhere.test/s.xml (not on the index's host)",
                                        "/relative.xml (not an absolute http(s) URL)"]
    assert site.paths().count("/index.xml") == 1  # an index listing itself is read once
    def utc(*parts: int) -> float:
        return datetime(*parts, tzinfo=timezone.utc).timestamp()

    assert parse_lastmod("2026-03-01") == utc(2026, 3, 2) + 14 * 3600  # the end of the day, any zone
    assert parse_lastmod("2026-03-01T10:00:00+02:00") == utc(2026, 3, 1, 8)
    assert parse_lastmod("2026-03-01T10:00Z") == utc(2026, 3, 1, 10)
    assert parse_lastmod("2026-03-01T10:00:00.5Z") == utc(2026, 3, 1, 10) + 0.5
    assert parse_lastmod(" 2026-03 ") == utc(2026, 4, 1) + 14 * 3600
    for bad in ("yesterday", "2026-13-01", "", "2026-03-01T25:00Z"):
        assert parse_lastmod(bad) is None


def test_document_count_and_depth_are_bounded(site: SitemapSite) -> None:
    u = site.url
    children = [f"{u}/deeper.xml", *(f"{u}/s{i}.xml" for i in range(30))]
    site.routes["/index.xml"] = Route(lambda: index(children))
    site.routes["/deeper.xml"] = Route(lambda: index([f"{u}/deepest.xml"]))
    site.routes["/deepest.xml"] = Route(lambda: index([f"{u}/s0.xml"]))
    for i in range(30):
        site.routes[f"/s{i}.xml"] = Route(lambda i=i: urlset([(f"{u}/p/{i}", None)]))
    reader = SitemapReader(SitemapLimits(max_documents=6, max_depth=2))
    urls = [e.url for e in reader.entries([f"{u}/index.xml"])]
    # The index keeps 6 of its 31 children (25 skipped); deepest's child would be level 3 (skipped);
    # index, deeper, deepest, s0, s1, s2 make 6 documents, so s3 and s4 are skipped too.
    assert urls == [f"{u}/p/{i}" for i in range(3)] and reader.opened == 6
    assert reader.skipped == 25 + 1 + 2 and len(site.hits) == 6
    assert f"{u}/s0.xml (deeper than 2 levels)" in reader.skipped_documents
