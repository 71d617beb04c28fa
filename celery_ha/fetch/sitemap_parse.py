"""The byte and XML layers of the sitemap reader (``celery_ha.fetch.sitemap``): gzip decoded chunk by
chunk with a bounded output per step, size and time caps, an expat parser that refuses any DTD and
keeps only the entry being parsed, text sitemaps, and W3C datetimes (``<lastmod>``).

Nothing here does I/O: the reader feeds it the chunks of a response.
"""

from __future__ import annotations

import re
import time
import zlib
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from xml.parsers import expat

from celery_ha.base.errors import CeleryHAError
from celery_ha.base.validation import MAX_URL_BYTES

CHUNK = 64 * 1024
_GZIP_MAGIC = b"\x1f\x8b"


class InvalidSitemap(CeleryHAError):
    """A document that is not a sitemap we can read (malformed XML, a DTD, too large, too many URLs,
    wrong root element): retrying cannot help, so ``permanent`` is True."""

    permanent = True


#: W3C Datetime (the sitemap protocol's lastmod): YYYY, YYYY-MM, YYYY-MM-DD, then optionally
#: Thh:mm[:ss[.s+]] and a zone (Z or ±hh:mm); a missing zone is read as UTC.
_W3C = re.compile(r"(\d{4})(?:-(\d{2})(?:-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d+))?)?"
                  r"\s*(Z|[+-]\d{2}:?\d{2})?)?)?)?")


#: How much later than its UTC end a date-only (or year, year-month) lastmod may still mean: the
#: site's own day ends up to 12 h after UTC's (UTC-12), rounded up to the widest offset in use (±14 h).
ZONE_SLACK = 14 * 3600


#: How far past the reader's clock a lastmod's earliest meaning may lie (clocks differ) before it is
#: read as none.
CLOCK_SKEW = 3600


def parse_lastmod(text: str, now: float | None = None) -> float | None:
    """A sitemap ``<lastmod>`` as epoch seconds; None when it is not a W3C datetime (an unreadable
    lastmod, a zone offset out of range included, must not stop an ingestion: the URL is then treated
    as having none), nor when the earliest instant it can mean is later than ``now`` (the reader's
    clock, default ``time.time()``) plus :data:`CLOCK_SKEW`: a lastmod in the future (a wrong clock, a
    placeholder such as 2099) would otherwise read as "changed since it finished" at every ingestion
    until that date.

    A lastmod without a time (``2026-03-01``, ``2026-03``, ``2026``) is read as the *latest* instant
    it can mean: the end of that day (month, year) plus :data:`ZONE_SLACK`. It is only ever compared
    with a completion time, and the imprecision is resolved towards fetching again, as the completion
    side's is (``state/done_times.py``): a page crawled in the morning and changed in the afternoon
    of the day its lastmod names is queued again, not skipped as unchanged. The cost is bounded by
    the precision the site chose: such a page is queued again on every run until a run after that
    period (and its slack) has fetched it."""
    m = _W3C.fullmatch(text.strip())
    if not m:
        return None
    year, month, day, hour, minute, second, fraction, zone = m.groups()
    try:
        tz = timezone.utc
        if zone and zone != "Z":
            sign = -1 if zone[0] == "-" else 1
            digits = zone[1:].replace(":", "")
            tz = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
        at = datetime(int(year), int(month or 1), int(day or 1), int(hour or 0), int(minute or 0),
                      int(second or 0), int((fraction or "0")[:6].ljust(6, "0")), tzinfo=tz)
        earliest = at.timestamp() - (ZONE_SLACK if hour is None else 0)  # a date starts first at UTC+14
        if earliest > (time.time() if now is None else now) + CLOCK_SKEW:
            return None
        if hour is None:  # a date, a month or a year: its end, in the latest zone it may be in
            if day is not None:
                end = at + timedelta(days=1)
            elif month is not None:
                end = at.replace(year=at.year + (at.month == 12), month=at.month % 12 + 1)
            else:
                end = at.replace(year=at.year + 1)
            return end.timestamp() + ZONE_SLACK
    except (ValueError, OverflowError):  # month 13, hour 25, a zone of ±24:00 or more, year 9999's end
        return None
    return at.timestamp()


# ---------------------------------------------------------------------- bytes: gunzip, caps
def gunzip(chunks: Iterator[bytes], what: str = "document") -> Iterator[bytes]:
    """gzip (one or more members) decoded chunk by chunk, each step's output capped at CHUNK bytes, so
    a highly compressed input never expands in memory beyond one chunk before the size cap sees it.
    NUL bytes after a member are padding (tape-era writers and some servers add it; gzip(1) and
    Python's gzip module skip it), not a broken member."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    between = False  # after a member's end: NUL padding or the next member may follow
    try:
        for chunk in chunks:
            data = chunk
            while data:
                if between:
                    data = data.lstrip(b"\0")
                    if not data:
                        break
                    between = False
                out = d.decompress(data, CHUNK)
                if out:
                    yield out
                if d.eof:  # a new gzip member may follow (concatenated .gz files are valid gzip)
                    data = d.unused_data
                    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    between = True
                else:
                    data = d.unconsumed_tail
        tail = d.flush()
        if tail:
            yield tail
    except zlib.error as exc:
        raise InvalidSitemap(f"{what} is not valid gzip ({exc})") from None


def sniffed(chunks: Iterator[bytes], layers: int = 2, what: str = "document") -> Iterator[bytes]:
    """``chunks`` gunzipped while they start with the gzip magic (at most ``layers`` times: a .xml.gz
    served with Content-Encoding: gzip is gzipped twice)."""
    head = b""
    for chunk in chunks:
        head += chunk
        if len(head) >= 2:
            break
    rest = chain(head, chunks)
    if layers and head.startswith(_GZIP_MAGIC):
        return sniffed(gunzip(rest, what), layers - 1, what)
    return rest


def chain(head: bytes, chunks: Iterator[bytes]) -> Iterator[bytes]:
    if head:
        yield head
    yield from chunks


def capped(chunks: Iterator[bytes], limit: int, deadline: float, what: str) -> Iterator[bytes]:
    """``chunks`` until ``limit`` bytes or the deadline: InvalidSitemap past either."""
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise InvalidSitemap(f"{what} is larger than {limit:,} bytes (uncompressed)")
        if time.monotonic() > deadline:
            raise InvalidSitemap(f"{what} took longer than the time allowed for one document")
        yield chunk


# ---------------------------------------------------------------------- parsing
class XmlEntries:
    """Entries of one XML sitemap document, fed chunk by chunk (expat, no DTD, no tree)."""

    def __init__(self, what: str, max_urls: int) -> None:
        self.what = what
        self.max_urls = max_urls
        self.kind = ""  # "urlset" | "sitemapindex", from the root element
        self.count = 0
        self.ready: list[tuple[str, str]] = []  # (loc, lastmod text) parsed from the current chunk
        self._ns = ""
        self._depth = 0
        self._field = ""  # "loc" | "lastmod" while inside one
        self._text: list[str] = []
        self._size = 0
        self._loc = ""
        self._lastmod = ""
        p = expat.ParserCreate(namespace_separator=" ")
        p.buffer_text = True
        p.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        p.StartDoctypeDeclHandler = self._refuse_dtd
        p.EntityDeclHandler = self._refuse_entity
        p.ExternalEntityRefHandler = self._refuse_entity
        p.StartElementHandler = self._start
        p.EndElementHandler = self._end
        p.CharacterDataHandler = self._chars
        self._parser = p

    def feed(self, data: bytes, final: bool = False) -> None:
        try:
            self._parser.Parse(data, final)
        except expat.ExpatError as exc:
            raise InvalidSitemap(f"{self.what} is not well-formed XML ({expat.errors.messages[exc.code]} "
                                 f"at line {exc.lineno}, column {exc.offset})") from None

    def _refuse_dtd(self, *_: object) -> None:
        raise InvalidSitemap(f"{self.what} has a <!DOCTYPE>: refused (sitemaps have none; a DTD could "
                             "declare entities that expand without bound)")

    def _refuse_entity(self, *_: object) -> None:
        raise InvalidSitemap(f"{self.what} declares or references an entity: refused")

    @staticmethod
    def _split(name: str) -> tuple[str, str]:
        ns, _, local = name.rpartition(" ")
        return ns, local

    def _start(self, name: str, _attrs: object) -> None:
        self._depth += 1
        ns, local = self._split(name)
        if self._depth == 1:
            if local not in ("urlset", "sitemapindex"):
                raise InvalidSitemap(f"{self.what} is not a sitemap: its root element is <{local}>, "
                                     "not <urlset> or <sitemapindex>")
            self.kind, self._ns = local, ns
        elif self._depth == 3 and ns == self._ns and local in ("loc", "lastmod"):
            self._field, self._text, self._size = local, [], 0

    def _chars(self, text: str) -> None:
        if self._field:
            self._size += len(text)
            if self._size <= MAX_URL_BYTES:  # longer: kept cut, refused as a URL later
                self._text.append(text)

    def _end(self, name: str) -> None:
        if self._depth == 3 and self._field:
            value = "".join(self._text).strip()
            if self._size > MAX_URL_BYTES:
                value = value + "…"  # never a valid URL: counted invalid, not silently truncated
            if self._field == "loc":
                self._loc = value
            else:
                self._lastmod = value
            self._field = ""
        elif self._depth == 2:
            ns, local = self._split(name)
            if ns == self._ns and local in ("url", "sitemap") and self._loc:
                self.count += 1
                if self.count > self.max_urls:
                    raise InvalidSitemap(f"{self.what} lists more than {self.max_urls:,} entries")
                self.ready.append((self._loc, self._lastmod))
            self._loc = self._lastmod = ""
        self._depth -= 1


def text_entries(data: Iterator[bytes], what: str, max_urls: int) -> Iterator[tuple[str, str]]:
    """A text sitemap: one URL per line (UTF-8, as the protocol requires), blank lines skipped. A body
    that is not UTF-8 text (a binary file, an unknown compression) is refused, not read as garbage.

    Lines are found by searching each chunk once, and a line longer than any URL can be is cut where
    it passes that length (its rest is read and dropped, never held): the kept part, marked with "…",
    is then refused as a URL and counted invalid. So one 50 MB line costs one pass and a few KiB, not
    a re-split of an ever-growing buffer per chunk."""
    pending = bytearray()
    cut = False  # the current line passed _LINE_MAX: the rest of it is being dropped
    count = 0
    number = 0
    for chunk in data:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if not cut:
                pending += piece[:_LINE_MAX + 1 - len(pending)]
                cut = len(pending) > _LINE_MAX
            if end < 0:
                break
            start = end + 1
            number += 1
            line = _text_line(pending, what, number, cut)
            pending.clear()
            cut = False
            if line:
                count += 1
                if count > max_urls:
                    raise InvalidSitemap(f"{what} lists more than {max_urls:,} entries")
                yield line, ""
    line = _text_line(pending, what, number + 1, cut)
    if line and count < max_urls:
        yield line, ""


#: The longest text line kept: a URL (MAX_URL_BYTES) with room for the whitespace around it.
_LINE_MAX = MAX_URL_BYTES + 256


def _text_line(raw: bytearray, what: str, number: int, cut: bool) -> str:
    if b"\0" in raw:
        raise InvalidSitemap(f"{what} is neither XML nor text (a NUL byte on line {number})")
    if cut:  # never a valid URL: counted invalid by the ingestion, not silently truncated
        return raw.decode("utf-8", "replace").strip() + "…"
    try:
        return raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise InvalidSitemap(f"{what} is neither XML nor UTF-8 text (line {number})") from None
