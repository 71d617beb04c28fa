"""Point a Scrapy request at a borrowed proxy, credentials the way Scrapy sends them.

Scrapy's ``HttpProxyMiddleware`` turns ``meta['proxy'] = 'http://user:pass@host:port'`` into
``meta['proxy'] = 'http://host:port'`` plus a ``Proxy-Authorization: Basic …`` header and remembers the
proxy in ``meta['_auth_proxy']``. The pool's middleware runs after it (it must be the last downloader
middleware to see the raw response first), so it writes that final form itself: the password never
sits in ``meta`` (which spiders, pipelines and debug logs read), and on a retry through a different
proxy the old header is replaced or dropped, never sent to the wrong proxy.
"""

from __future__ import annotations

import base64
from urllib.parse import unquote, urlsplit

from scrapy.http import Request

from celery_ha.base.masking import mask_url

AUTH_HEADER = b"Proxy-Authorization"
AUTH_PROXY = "_auth_proxy"  # Scrapy's HttpProxyMiddleware key: the proxy the header belongs to
#: Proxy schemes Scrapy's HTTP download handler speaks (it has no SOCKS support).
SCRAPY_SCHEMES = frozenset({"http", "https"})


def scrapy_can_use(url: str) -> bool:
    """Whether Scrapy can send through this proxy URL at all."""
    return urlsplit(url).scheme.lower() in SCRAPY_SCHEMES


def proxy_parts(url: str, encoding: str = "latin-1") -> tuple[str, bytes | None]:
    """(proxy URL without credentials, Basic credentials or None) of a pool proxy URL."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    bare = f"{parts.scheme.lower()}://{host}" + (f":{parts.port}" if parts.port else "")
    if not parts.username:
        return bare, None
    user_pass = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode(encoding)
    return bare, base64.b64encode(user_pass)


def route_through(request: Request, url: str | None, encoding: str = "latin-1") -> None:
    """Send ``request`` through the proxy at ``url`` (None = directly), replacing any earlier proxy."""
    if url is None:
        request.meta["proxy"] = None
        request.meta.pop(AUTH_PROXY, None)
        request.headers.pop(AUTH_HEADER, None)
        return
    bare, creds = proxy_parts(url, encoding)
    request.meta["proxy"] = bare
    if creds is None:
        request.meta.pop(AUTH_PROXY, None)
        request.headers.pop(AUTH_HEADER, None)
    else:
        request.meta[AUTH_PROXY] = bare
        request.headers[AUTH_HEADER] = b"Basic " + creds


def shown(request: Request) -> str:
    """A request as the log lines show it: method and URL, credentials in the URL masked."""
    return f"<{request.method} {mask_url(request.url)}>"
