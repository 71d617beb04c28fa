"""The start of a raw response body as text, decompressed only as far as a captcha scan reads.

Why this exists: the proxy middleware judges the answer at ``response_downloaded``, before Scrapy's
``HttpCompressionMiddleware`` decodes it, and sites compress a captcha page like any other page
(Scrapy asks for gzip, deflate, br and zstd). Scanning the compressed bytes finds nothing, so a
captcha would count as ``ok``.

Every layer is decompressed with a bound on its *output*: a few kilobytes of gzip can expand to
gigabytes (a decompression bomb), and the scan reads only the first ``CAPTCHA_SCAN_CHARS`` anyway. An
encoding this process cannot decode with a bound (an unknown one, or a brotli binding too old to take
an output limit) leaves the body unread rather than decoded whole.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from scrapy.http import Response, TextResponse
from w3lib.encoding import html_to_unicode

try:  # what Scrapy itself uses for "br": brotli on CPython, brotlicffi on PyPy
    import brotli as _brotli
except ImportError:  # pragma: no cover - depends on the installed extras
    try:
        import brotlicffi as _brotli
    except ImportError:
        _brotli = None
try:  # Python >= 3.14
    from compression import zstd as _zstd  # type: ignore[import-not-found]
except ImportError:
    try:  # what Scrapy >= 2.19 installs on older Pythons
        from backports import zstd as _zstd  # type: ignore[import-not-found,no-redef]
    except ImportError:  # pragma: no cover - depends on the installed extras
        _zstd = None

#: Bytes of decompressed output per character scanned: UTF-8 takes up to 4 bytes a character.
BYTES_PER_CHAR = 4
#: Compressed input read beyond the output wanted: data that does not compress is stored in blocks
#: of about its own size plus a few header bytes, so this much more always yields the output, and a
#: multi-megabyte body is not copied whole into the decompressor's unconsumed tail.
INPUT_SLACK = 64 * 1024


def _gunzip(data: bytes, limit: int) -> bytes:
    return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, limit)


def _inflate(data: bytes, limit: int) -> bytes:
    """HTTP "deflate" is zlib-wrapped by the standard, raw deflate from some servers (as Scrapy reads it)."""
    try:
        return zlib.decompressobj(zlib.MAX_WBITS).decompress(data, limit)
    except zlib.error:
        return zlib.decompressobj(-zlib.MAX_WBITS).decompress(data, limit)


def _unbrotli(data: bytes, limit: int) -> bytes:
    # output_buffer_limit stops the output growing once it reaches the limit (brotli >= 1.2,
    # brotlicffi >= 1.2); an older binding refuses the keyword with TypeError, never decoding unbounded.
    return bytes(_brotli.Decompressor().process(data, output_buffer_limit=limit))[:limit]


def _unzstd(data: bytes, limit: int) -> bytes:
    return bytes(_zstd.ZstdDecompressor().decompress(data, max_length=limit))


#: Content codings this process can decompress with an output bound.
DECODERS: dict[str, Callable[[bytes, int], bytes]] = {"gzip": _gunzip, "x-gzip": _gunzip, "deflate": _inflate}
if _brotli is not None:
    DECODERS["br"] = _unbrotli
if _zstd is not None:
    DECODERS["zstd"] = _unzstd


def content_codings(response: Response) -> list[str]:
    """The body's content codings in the order they were applied (``identity`` left out)."""
    raw = b",".join(response.headers.getlist(b"Content-Encoding"))
    names = (part.strip().lower() for part in raw.decode("latin-1").split(","))
    return [name for name in names if name and name != "identity"]


def decoded_head(body: bytes, codings: list[str], limit: int) -> bytes | None:
    """At most ``limit`` bytes of the start of ``body`` with ``codings`` undone (last applied first);
    None when one of them cannot be undone here or the data is not what the header says."""
    data = body
    for coding in reversed(codings):
        decode = DECODERS.get(coding)
        if decode is None:
            return None
        try:
            data = decode(data[: limit + INPUT_SLACK], limit)
        except Exception:  # zlib.error, brotli.error, ZstdError, TypeError of an old binding ...
            return None
    return data[:limit]


def body_head(response: Response, chars: int) -> str | None:
    """The first ``chars`` characters of the body as a browser would read them, or None when the
    body is compressed in a way that cannot be read with a bound (then nothing is judged from it).

    A body whose header names codings it does not carry (already decoded, or a server that lies)
    is read as it is, as Scrapy would show it.
    """
    codings = content_codings(response)
    if codings:
        head = decoded_head(response.body, codings, chars * BYTES_PER_CHAR)
        if head is not None:
            ctype = response.headers.get(b"Content-Type")
            _, text = html_to_unicode(ctype.decode("latin-1") if ctype else None, head)
            return text[:chars]
        if any(coding not in DECODERS for coding in codings):
            return None
    if isinstance(response, TextResponse):
        return response.text[:chars]
    return None


def looks_textual(response: Response) -> bool:
    """Whether the answer is a page a captcha could be on: HTML or text, or no type declared and
    either text by Scrapy's sniffing or compressed (the sniffing then saw only compressed bytes)."""
    ctype = response.headers.get(b"Content-Type", b"").decode("latin-1").lower()
    if ctype:
        return "html" in ctype or "text" in ctype
    return isinstance(response, TextResponse) or bool(content_codings(response))
