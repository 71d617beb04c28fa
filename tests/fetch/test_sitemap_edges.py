"""Sitemap reading at the edges a real site reaches: lastmods the reader cannot use, robots.txt files
that point at robots.txt files, very long text lines, gzip padding, and a batch that mixes invalid and
unchanged pages; against a real HTTP server serving generated sitemaps and a real Redis."""

from __future__ import annotations

import gc
import gzip
import tracemalloc
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from celery_ha.fetch.sitemap import InvalidSitemap, SitemapLimits, SitemapReader, parse_lastmod
from celery_ha.fetch.sitemap_ingest import SitemapIngest
from celery_ha.state import TaskQueue
from celery_ha.state.enqueue_args import SCRIPT_BATCH
from tests.support.script_calls import script_calls
from tests.support.sitemap_site import Route, SitemapSite, urlset

TASK = "fetch_page"
NAMESPACE = "sme"  # the q fixture's (conftest.py)




def _ingest(q: TaskQueue, urls: list[str], **kw) -> SitemapIngest:
    ingest = SitemapIngest(q, task=TASK, **kw)
    ingest.run(urls)
    return ingest


def _finish_all(q: TaskQueue) -> None:
    """Claim and complete every queued task (the real transitions a worker makes)."""
    while (lease := q.claim_next("w:1")) is not None:
        q.complete(lease)


def test_a_zone_offset_out_of_range_reads_as_no_lastmod(site: SitemapSite, q: TaskQueue) -> None:
    """One ``+24:00`` lastmod (no such zone) must not stop the ingestion of the other 249 pages."""
    u = site.url
    for bad in ("2024-01-01T10:00:00+24:00", "2024-01-01T10:00:00+99:00", "2024-01-01T10:00-30:00"):
        assert parse_lastmod(bad) is None, bad
    site.routes["/s.xml"] = Route(lambda: urlset(
        (f"{u}/p/{i}", "2024-01-01T10:00:00+24:00" if i == 150 else "2024-01-01") for i in range(250)))
    counts = _ingest(q, [f"{u}/s.xml"], batch_size=100).counts
    assert (counts.seen, counts.new) == (250, 250)
    assert q.stats()["queued"] == 250


def test_a_date_only_lastmod_is_the_end_of_its_day(site: SitemapSite, q: TaskQueue) -> None:
    """A page crawled today and changed later today: the sitemap can only say "today", which is read
    as the end of the day (plus the widest zone), so the page is queued again, not skipped."""
    def utc(*parts: int) -> float:
        return datetime(*parts, tzinfo=timezone.utc).timestamp()

    slack = 14 * 3600
    assert parse_lastmod("2026-03-01") == utc(2026, 3, 2) + slack
    assert parse_lastmod("2026-12") == utc(2027, 1, 1) + slack
    assert parse_lastmod("2026") == utc(2027, 1, 1) + slack
    assert parse_lastmod("2026-03-01T10:00Z") == utc(2026, 3, 1, 10)  # a time is taken as written
    u = site.url
    lastmod = {"v": "2021-01-01"}
    site.routes["/s.xml"] = Route(lambda: urlset([(f"{u}/p/0", lastmod["v"]), (f"{u}/p/1", "2021-01-01")]))
    assert _ingest(q, [f"{u}/s.xml"]).counts.new == 2
    _finish_all(q)
    lastmod["v"] = datetime.now(timezone.utc).date().isoformat()
    counts = _ingest(q, [f"{u}/s.xml"]).counts
    assert (counts.changed, counts.unchanged) == (1, 1)


def test_a_lastmod_in_the_future_is_read_as_none(site: SitemapSite, q: TaskQueue) -> None:
    """A site whose lastmod says 2099 (a wrong clock, a placeholder): its finished pages are
    duplicates at the next ingestion, not "changed since they finished" at every one until 2099. A
    date-only lastmod of today still counts (it may mean up to the end of today in the widest zone)."""
    at = datetime(2030, 6, 1, tzinfo=timezone.utc).timestamp()
    assert parse_lastmod("2030-06-01T01:00Z", now=at) is not None  # within the clocks' skew
    assert parse_lastmod("2030-06-01T02:00Z", now=at) is None
    assert parse_lastmod("2030-06-01", now=at - 13 * 3600) is not None  # already today at UTC+14
    assert parse_lastmod("2030-06-02", now=at) is None
    assert parse_lastmod("2030-06", now=at) is not None and parse_lastmod("2030-07", now=at) is None
    u = site.url
    today = datetime.now(timezone.utc).date().isoformat()
    site.routes["/s.xml"] = Route(lambda: urlset(
        [(f"{u}/p/{i}", "2099-01-01T00:00:00Z") for i in range(3)] + [(f"{u}/today", "2020-01-01")]))
    assert _ingest(q, [f"{u}/s.xml"]).counts.new == 4
    _finish_all(q)
    site.routes["/s.xml"] = Route(lambda: urlset(
        [(f"{u}/p/{i}", "2099-01-01T00:00:00Z") for i in range(3)] + [(f"{u}/today", today)]))
    for _ in range(2):
        counts = _ingest(q, [f"{u}/s.xml"]).counts
        assert (counts.new, counts.changed, counts.duplicates) == (1, 1, 3)  # /today changed, p/* not
        _finish_all(q)


def test_unchanged_pages_are_counted_once_in_a_batch_with_an_invalid_url(site: SitemapSite,
                                                                         q: TaskQueue) -> None:
    u = site.url
    extra: list[tuple[str, str | None]] = []
    pages = [(f"{u}/p/{i}", "2020-01-01") for i in range(10)]
    site.routes["/s.xml"] = Route(lambda: urlset([*pages, *extra]))
    assert _ingest(q, [f"{u}/s.xml"]).counts.new == 10
    _finish_all(q)
    extra.append(("not a url", None))  # no lastmod: refused by enqueue, after the batch was split once
    counts = _ingest(q, [f"{u}/s.xml"]).counts
    assert (counts.seen, counts.unchanged, counts.invalid, counts.new) == (11, 10, 1, 0)


def test_a_robots_txt_is_read_only_as_the_start_url(site: SitemapSite) -> None:
    """robots.txt may point anywhere, so a robots.txt listing robots.txt files would chain without
    end (and past the depth limit): only the start URL is read as one; the others are skipped."""
    u = site.url
    for n in range(600):  # /robots.txt?n=0 -> /robots.txt?n=1 -> ... (each also lists one urlset)
        site.routes[f"/robots.txt?n={n}"] = Route(
            lambda n=n: [f"Sitemap: {u}/robots.txt?n={n + 1}\nSitemap: {u}/s{n}.xml\n".encode()],
            content_type="text/plain")
        site.routes[f"/s{n}.xml"] = Route(lambda n=n: urlset([(f"{u}/p/{n}", None)]))
    reader = SitemapReader()
    assert [e.url for e in reader.entries([f"{u}/robots.txt?n=0"])] == [f"{u}/p/0"]
    assert reader.skipped_documents == [f"{u}/robots.txt?n=1 (a robots.txt is read only as a start URL)"]
    assert site.paths() == ["/robots.txt?n=0", "/s0.xml"]
    # And no document is read deeper than max_depth, whoever lists it (here robots.txt, at level 1).
    shallow = SitemapReader(SitemapLimits(max_depth=0))
    assert list(shallow.entries([f"{u}/robots.txt?n=0"])) == []
    assert f"{u}/s0.xml (deeper than 0 levels)" in shallow.skipped_documents


def test_robots_txt_with_a_bom_or_a_relative_sitemap_line(site: SitemapSite) -> None:
    u = site.url
    site.routes["/s.xml"] = Route(lambda: urlset([(f"{u}/p/0", None)]))
    for body in (f"\ufeffSitemap: {u}/s.xml\n", "User-agent: *\nSitemap: /s.xml\n"):
        site.routes["/robots.txt"] = Route(lambda body=body: [body.encode()], content_type="text/plain")
        assert [e.url for e in SitemapReader().entries([u])] == [f"{u}/p/0"], body


def test_gzip_followed_by_nul_padding_is_read(site: SitemapSite) -> None:
    """gzip(1) and Python's gzip skip NUL padding after a member; other trailing garbage is refused,
    and the error names the document."""
    u = site.url
    gz = gzip.compress(b"".join(urlset((f"{u}/p/{i}", None) for i in range(10))))
    site.routes["/padded.xml.gz"] = Route(lambda: [gz + b"\0" * 512, b"\0" * 512])
    site.routes["/junk.xml.gz"] = Route(lambda: [gz + b"\0\0junk"])
    assert len(list(SitemapReader().entries([f"{u}/padded.xml.gz"]))) == 10
    with pytest.raises(InvalidSitemap, match="not valid gzip") as err:
        list(SitemapReader().entries([f"{u}/junk.xml.gz"]))
    assert "/junk.xml.gz" in str(err.value)


def test_a_very_long_text_line_is_cut_and_counted_invalid(site: SitemapSite, q: TaskQueue) -> None:
    """A 6 MB line in a text sitemap is read in one pass and never held: the reader keeps at most a
    URL's length of it, and the line is counted invalid; the lines around it are queued."""
    u = site.url
    size = 6 * 1024 * 1024

    def body() -> Iterator[bytes]:
        yield f"{u}/before\n{u}/x".encode()
        block = b"y" * 65536
        for _ in range(size // len(block)):
            yield block
        yield f"\n{u}/after\n".encode()

    site.routes["/list.txt"] = Route(body, content_type="text/plain")
    gc.collect()
    tracemalloc.start()
    try:
        counts = _ingest(q, [f"{u}/list.txt"]).counts
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (counts.new, counts.invalid) == (2, 1)
    assert peak < size / 4, peak  # the server's chunks and the reader's buffers, never the line
    assert q.stats()["queued"] == 2


def test_text_lines_split_across_chunks_keep_their_numbers(site: SitemapSite) -> None:
    """The chunked line reader: lines cut anywhere by the network, CRLF, blanks, no final newline."""
    u = site.url
    text = "".join(f"{u}/p/{i}\r\n\n" for i in range(300)).encode() + f"{u}/last".encode()
    site.routes["/list.txt"] = Route(lambda: [text[i:i + 7] for i in range(0, len(text), 7)],
                                     content_type="text/plain")
    urls = [e.url for e in SitemapReader().entries([f"{u}/list.txt"])]
    assert urls == [*(f"{u}/p/{i}" for i in range(300)), f"{u}/last"]
    site.routes["/bad.txt"] = Route(lambda: [f"{u}/a\n{u}/b\n".encode(), b"\xff\xfe\n"],
                                    content_type="text/plain")
    with pytest.raises(InvalidSitemap, match=r"UTF-8 text \(line 3\)"):
        list(SitemapReader().entries([f"{u}/bad.txt"]))


def test_a_large_batch_is_queued_in_short_script_calls(site: SitemapSite, q: TaskQueue,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The sitemap task's batches are 1,000 pages (its checkpoint unit); the enqueue under them
    still sends at most SCRIPT_BATCH rows a call, so no call keeps Redis busy long at depth."""
    u = site.url
    site.routes["/s.xml"] = Route(lambda: urlset((f"{u}/p/{i}", None) for i in range(230)))
    calls = script_calls(q, monkeypatch)
    counts = _ingest(q, [f"{u}/s.xml"], batch_size=1000).counts
    assert counts.new == 230 and q.stats()["queued"] == 230
    assert calls.count("enqueue") == -(-230 // SCRIPT_BATCH)

