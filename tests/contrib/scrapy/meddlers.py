"""A downloader middleware numbered above the pool's that drops, replaces and answers requests itself.

Each behaviour is chosen by the request URL's ``m=`` query parameter; ``clean`` drops the parameter, so
a replacement is a different page for the dupefilter (``same`` keeps it: the dupefilter drops it).
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from scrapy.exceptions import IgnoreRequest
from scrapy.http import HtmlResponse, Request, Response


def mode(request: Request) -> str:
    return parse_qs(urlsplit(request.url).query).get("m", [""])[0]


def clean(url: str) -> str:
    return urlunsplit(urlsplit(url)._replace(query=""))


def made_up(request: Request) -> HtmlResponse:
    return HtmlResponse(url=request.url, body=b"<html><title>made up</title></html>", encoding="utf-8",
                        request=request)


class Meddler:
    def __init__(self) -> None:
        # Bound, never listening: a connection to it is refused at once.
        self._closed = socket.socket()
        self._closed.bind(("127.0.0.1", 0))
        self.refusing_proxy = f"http://127.0.0.1:{self._closed.getsockname()[1]}"

    def process_request(self, request: Request, spider: Any = None) -> Request | Response | None:
        m = mode(request)
        if m == "replace":  # a new request instead: ours never reaches the downloader
            return request.replace(url=clean(request.url))
        if m == "same":  # the same request back to the scheduler, whose dupefilter drops it
            return request
        if m == "ignore":
            raise IgnoreRequest("meddler refused it")
        if m == "fake":  # answered without downloading
            return made_up(request)
        if m in ("refused", "refused-retry"):  # the download will fail
            request.meta["proxy"] = self.refusing_proxy
        return None

    def process_response(
        self, request: Request, response: Response, spider: Any = None
    ) -> Request | Response:
        if mode(request) == "redo":  # the downloaded answer replaced by a new request
            return request.replace(url=clean(request.url))
        return response

    def process_exception(self, request: Request, exception: Exception, spider: Any = None) -> Any:
        m = mode(request)
        if m == "refused":  # the failure turned into a response before the pool's middleware sees it
            return made_up(request)
        if m == "refused-retry":  # ... or into a new request
            return request.replace(url=clean(request.url))
        return None
