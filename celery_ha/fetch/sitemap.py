"""A streaming sitemap reader: robots.txt ``Sitemap:`` lines, sitemap indexes, urlsets, text sitemaps,
gzip, ``<lastmod>``, in bounded memory, bounded size and bounded time.

Why streaming: a sitemap holds up to 50,000 URLs (and a site may list hundreds of sitemaps), so a
reader that parses a whole document into a tree holds tens of megabytes for one document. Here each
document is read in 64 KiB chunks, decompressed chunk by chunk (a bounded output per step, so a gzip
bomb is cut off at the size limit), and fed to expat, whose callbacks keep only the entry being
parsed: the reader yields every URL as soon as its ``</url>`` closes and forgets it.

Why expat directly and not ElementTree: a sitemap is flat (root, entry, ``loc``/``lastmod``), so no
tree is needed at all, and expat's handlers let the reader refuse a ``<!DOCTYPE>`` outright — no DTD
means no entity declarations, so no entity expansion (billion laughs) and no external entities, with
the standard library alone.

What is read: ``robots.txt`` (a URL whose path is ``/robots.txt``, or a bare site root ``https://host/``,
given as a start URL: one listed by a robots.txt or an index is skipped) gives its ``Sitemap:`` lines;
an XML ``<sitemapindex>`` gives child sitemaps (on the same host as the index, as the protocol
requires: an index can never send the reader to another host), read depth first up to ``max_depth``
levels (any document deeper is skipped, whoever listed it) and ``max_documents`` documents; an XML
``<urlset>`` (namespace-agnostic: entries are the root's own-namespace ``url/loc``, so ``image:loc``
and the like are ignored) or a plain text sitemap (one URL per line) gives page URLs with their
``lastmod``. A body starting with the gzip magic bytes is gunzipped, whether it is a ``.xml.gz`` file
or a ``Content-Encoding: gzip`` answer.

Positions: every page entry comes with its position, ``(i0, i1, ..., ik, n)``: the index of each
document on the path from the start URLs down to the urlset, then the number of entries of that urlset
read so far. Positions grow in reading order, so "everything up to this position is done" is one small
JSON list; :meth:`SitemapReader.entries` with ``resume=`` skips every document before it without
fetching it and every entry up to it.

The byte and XML layers (gunzip, caps, the expat parser, lastmod) are in ``sitemap_parse``; queueing
the entries is ``sitemap_ingest``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urljoin, urlsplit, urlunsplit

import requests
from requests.adapters import HTTPAdapter

from celery_ha.base.errors import InvalidInput
from celery_ha.base.masking import mask_url
from celery_ha.base.validation import check_url
from celery_ha.fetch.errors import FetchError, PermanentFetchError
from celery_ha.fetch.sitemap_parse import (
    CHUNK,
    InvalidSitemap,
    XmlEntries,
    capped,
    chain,
    parse_lastmod,
    sniffed,
    text_entries,
)

__all__ = ["InvalidSitemap", "SitemapEntry", "SitemapLimits", "SitemapReader", "parse_lastmod",
           "robots_url_of"]

#: Refused child sitemaps listed by name (the rest are only counted).
SKIPPED_SHOWN = 100
_USER_AGENT = "celery-ha-sitemap/1 (+https://www.sitemaps.org/protocol.html)"
#: What may precede a document's first byte of content: a UTF-8 BOM and whitespace.
_BLANK = b"\xef\xbb\xbf \t\r\n"


@dataclass(frozen=True)
class SitemapLimits:
    """The bounds of one ingestion; the defaults are the sitemap protocol's own limits.

    ``max_bytes``: uncompressed bytes per document (the protocol's 50 MB; robots.txt gets 512 KiB).
    ``max_urls``: entries per document (the protocol's 50,000). ``max_depth``: levels below the start
    URL (robots.txt → index → urlset is 2). ``max_documents``: documents read in all (robots.txt and
    indexes included). ``document_seconds``: wall time to read one document; ``timeout``: requests'
    (connect, read) timeout per network wait.
    """

    max_bytes: int = 50 * 1024 * 1024
    max_urls: int = 50_000
    max_depth: int = 3
    max_documents: int = 1000
    document_seconds: float = 300.0
    timeout: tuple[float, float] = (10.0, 30.0)
    robots_bytes: int = 512 * 1024


class SitemapEntry(NamedTuple):
    """One page of a urlset: its URL (as written, whitespace stripped), ``lastmod`` as epoch seconds
    (None when absent or unreadable) and its position (see the module docstring)."""

    url: str
    lastmod: float | None
    position: tuple[int, ...]


def robots_url_of(url: str) -> str | None:
    """The robots.txt URL when ``url`` asks for one (its path is ``/robots.txt``, or it is a bare site
    root), else None (a sitemap document)."""
    parts = urlsplit(url)
    if parts.path in ("", "/") and not parts.query:
        return urlunsplit((parts.scheme, parts.netloc, "/robots.txt", "", ""))
    return url if parts.path == "/robots.txt" else None


def _valid_url(url: str) -> bool:
    try:
        check_url(url)
    except InvalidInput:
        return False
    return True


def _host(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


# ---------------------------------------------------------------------- the reader
class SitemapReader:
    """Walks sitemaps depth first and yields their page entries (:meth:`entries`).

    Fetches directly with its own ``requests`` session (not through the proxy pool: the pool's
    fetcher reads whole bodies, and a sitemap must be streamed). ``opened`` counts documents read;
    ``skipped_documents`` lists child sitemaps refused (another host, past depth or count limits; the
    first :data:`SKIPPED_SHOWN` of them, ``skipped`` counts them all).
    """

    def __init__(self, limits: SitemapLimits | None = None, session: requests.Session | None = None,
                 user_agent: str = _USER_AGENT) -> None:
        self.limits = limits or SitemapLimits()
        if session is None:
            session = requests.Session()
            session.trust_env = False
            adapter = HTTPAdapter(pool_connections=4, pool_maxsize=4, max_retries=0)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
        self.session = session
        self.user_agent = user_agent
        self.opened = 0
        self.skipped_documents: list[str] = []
        self.skipped = 0
        self._seen: set[str] = set()

    def close(self) -> None:
        self.session.close()

    # -------------------------------------------------------------- public
    def entries(self, urls: Sequence[str], resume: Sequence[int] | None = None) -> Iterator[SitemapEntry]:
        """Every page entry of the sitemaps ``urls`` (sitemap, index or robots.txt URLs), in reading
        order; with ``resume`` (a position) only the entries after it. Raises InvalidInput for a bad
        start URL, FetchError (retryable) / PermanentFetchError for a document that cannot be fetched,
        InvalidSitemap for one that cannot be read."""
        for url in urls:
            try:
                check_url(url)
            except InvalidInput as exc:
                raise InvalidInput(f"sitemap URL {mask_url(str(url))!r}: {exc}") from None
        self._seen = set()
        self.opened = 0
        self.skipped_documents = []
        self.skipped = 0
        yield from self._walk(list(urls), (), list(resume or []), 0)

    # -------------------------------------------------------------- walking
    def _walk(self, urls: list[str], path: tuple[int, ...], resume: list[int], depth: int
              ) -> Iterator[SitemapEntry]:
        start = resume[0] if resume else 0
        for i, url in enumerate(urls):
            if i < start:
                continue
            rest = resume[1:] if resume and i == start else []
            yield from self._document(url, (*path, i), rest, depth)

    def _document(self, url: str, path: tuple[int, ...], resume: list[int], depth: int
                  ) -> Iterator[SitemapEntry]:
        key = url.split("#", 1)[0]
        if key in self._seen:
            return  # an index listing itself, or two indexes listing one sitemap
        if self.opened >= self.limits.max_documents:
            self._skip(url, f"past {self.limits.max_documents} documents")
            return
        if depth > self.limits.max_depth:  # whatever led here (an index, a robots.txt): never deeper
            self._skip(url, f"deeper than {self.limits.max_depth} levels")
            return
        robots = robots_url_of(url)
        if robots is not None and depth > 0:
            # Only a start URL is read as a robots.txt: one listed by a robots.txt or an index would
            # let robots.txt files chain to each other (another host each time, as robots.txt may).
            self._skip(url, "a robots.txt is read only as a start URL")
            return
        self._seen.add(key)
        if robots is not None:
            children = self._robots(robots)
            yield from self._walk(children, path, resume, depth + 1)
            return
        what = f"sitemap {mask_url(url)}"
        final, encoding, chunks, close = self._open(url)
        try:
            data = self._body(chunks, encoding, self.limits.max_bytes, what)
            head = b""
            for chunk in data:  # the first chunk with content: leading blank chunks are dropped, not
                if chunk.strip(_BLANK):  # joined (a body of blanks must not cost a copy per chunk)
                    head = chunk
                    break
            if not head.strip(_BLANK):
                raise InvalidSitemap(f"{what} is empty")
            body = chain(head, data)
            if head.lstrip(_BLANK).startswith(b"<"):
                yield from self._xml(body, final, path, resume, depth, what, close)
            else:
                skip = resume[0] if resume else 0
                for n, (loc, _) in enumerate(text_entries(body, what, self.limits.max_urls), 1):
                    if n > skip:
                        yield SitemapEntry(loc, None, (*path, n))
        finally:
            close()

    def _xml(self, body: Iterator[bytes], final: str, path: tuple[int, ...], resume: list[int],
             depth: int, what: str, close: Callable[[], None]) -> Iterator[SitemapEntry]:
        """The entries of an XML document; an index's children are collected (bounded by the
        document's entry limit), its connection closed, and then read depth first."""
        parser = XmlEntries(what, self.limits.max_urls)
        children: list[str] = []
        skip = resume[0] if resume else 0
        n = 0
        for chunk in body:
            parser.feed(chunk)
            ready, parser.ready = parser.ready, []
            if parser.kind == "sitemapindex":
                children += self._children(ready, final, depth, len(children))
                continue
            for loc, lastmod in ready:
                n += 1
                if n > skip:
                    yield SitemapEntry(loc, parse_lastmod(lastmod) if lastmod else None, (*path, n))
        parser.feed(b"", True)
        if not parser.kind:
            raise InvalidSitemap(f"{what} is empty")
        ready, parser.ready = parser.ready, []
        if parser.kind == "sitemapindex":
            children += self._children(ready, final, depth, len(children))
            close()  # before reading the children: never hold the index's connection meanwhile
            yield from self._walk(children, path, resume, depth + 1)
            return
        for loc, lastmod in ready:
            n += 1
            if n > skip:
                yield SitemapEntry(loc, parse_lastmod(lastmod) if lastmod else None, (*path, n))

    def _children(self, ready: list[tuple[str, str]], index_url: str, depth: int, held: int) -> list[str]:
        """The child sitemaps an index may send the reader to: on the index's own host, within depth,
        and no more than ``max_documents`` of them held (``held`` already are), so an index of 50,000
        long locations never sits in memory whole."""
        out: list[str] = []
        for loc, _ in ready:
            if depth + 1 > self.limits.max_depth:
                self._skip(loc, f"deeper than {self.limits.max_depth} levels")
            elif not _valid_url(loc):
                self._skip(loc, "not an absolute http(s) URL")
            elif _host(loc) != _host(index_url):
                self._skip(loc, "not on the index's host")
            elif held + len(out) >= self.limits.max_documents:
                self._skip(loc, f"past {self.limits.max_documents} documents")
            else:
                out.append(loc)
        return out

    def _skip(self, url: str, why: str) -> None:
        self.skipped += 1
        if len(self.skipped_documents) < SKIPPED_SHOWN:
            self.skipped_documents.append(f"{url[:200]} ({why})")

    def _robots(self, robots_url: str) -> list[str]:
        """The ``Sitemap:`` URLs of robots.txt (any host, as the protocol allows there)."""
        final, encoding, chunks, close = self._open(robots_url, robots=True)
        try:
            text = b"".join(self._body(chunks, encoding, self.limits.robots_bytes,
                                       f"robots.txt {mask_url(robots_url)}"))
        finally:
            close()
        found = []
        for raw in text.decode("utf-8-sig", "replace").splitlines():  # -sig: a BOM hides no line
            name, sep, value = raw.partition(":")
            value = value.split(" #", 1)[0].strip()  # a trailing comment; '#' inside a URL is kept
            if sep and name.strip().lower() == "sitemap" and value:
                # The protocol wants a full URL; a relative one ("/sitemap.xml") plainly means one on
                # the robots.txt's own site, so it is read as such rather than refused.
                value = urljoin(final, value)
                if not _valid_url(value):
                    self._skip(value, "not an absolute http(s) URL")
                elif len(found) >= self.limits.max_documents:
                    self._skip(value, f"past {self.limits.max_documents} documents")
                else:
                    found.append(value)
        if not found:
            raise InvalidSitemap(f"robots.txt {mask_url(final)} lists no 'Sitemap:' line")
        return found

    # -------------------------------------------------------------- I/O
    def _body(self, chunks: Iterator[bytes], encoding: str, limit: int, what: str) -> Iterator[bytes]:
        if encoding not in ("", "identity", "gzip", "x-gzip"):
            raise InvalidSitemap(f"{what}: unsupported Content-Encoding {encoding!r}")
        deadline = time.monotonic() + self.limits.document_seconds
        raw = capped(chunks, limit, deadline, what)  # compressed bytes are capped too
        return capped(sniffed(raw, what=what), limit, deadline, what)

    def _open(self, url: str, robots: bool = False) -> tuple[str, str, Iterator[bytes], Callable[[], None]]:
        """GET ``url`` streaming; 404/410 (and other 4xx) are permanent, 5xx/429/network retryable.
        A missing robots.txt reads as empty."""
        self.opened += 1
        shown_url = mask_url(url)
        try:
            response = self.session.get(url, stream=True, timeout=self.limits.timeout, headers={
                "User-Agent": self.user_agent, "Accept-Encoding": "gzip",
                "Accept": "application/xml,text/xml;q=0.9,text/plain;q=0.8,*/*;q=0.5"})
        except (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema,
                requests.exceptions.InvalidSchema) as exc:
            raise InvalidInput(f"cannot fetch sitemap {shown_url!r}: {type(exc).__name__}") from None
        except requests.exceptions.RequestException as exc:
            raise FetchError(f"cannot fetch {shown_url}: {type(exc).__name__}", url=url,
                             outcome="network", retry_after=5.0) from None
        status = response.status_code
        if robots and status in (404, 410):
            response.close()
            return response.url, "", iter(()), lambda: None
        if status >= 400:
            response.close()
            if status == 429 or status >= 500:
                raise FetchError(f"{shown_url} answered HTTP {status}", url=url, outcome="retry",
                                 status=status, retry_after=30.0)
            raise PermanentFetchError(f"{shown_url} answered HTTP {status}", url=url, status=status)
        encoding = response.headers.get("Content-Encoding", "").strip().lower()

        def stream() -> Iterator[bytes]:
            try:
                yield from response.raw.stream(CHUNK, decode_content=False)
            except Exception as exc:  # requests', urllib3's and socket errors: a cut connection
                raise FetchError(f"reading {shown_url} failed: {type(exc).__name__}", url=url,
                                 outcome="network", retry_after=5.0) from None

        return response.url, encoding, stream(), response.close
