"""Read at most N bytes of a response body, and never reuse the connection of a body cut short.

Why: robots.txt is parsed whole by every crawler that reads it, and a site may serve megabytes there
(RFC 9309 §2.5 asks a crawler to parse at least 500 KiB, and lets it stop there). ``requests`` reads
a body whole into memory; this reads a ``stream=True`` response up to ``limit`` decoded bytes, keeps
them as the response's content, and closes the connection when more was coming (a keep-alive
connection with a half-read body would hand its rest to the next request as its answer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import requests

from celery_ha.fetch.body_deadline import read_body_by


class _Capped:
    """A response's raw stream that ends after ``limit`` decoded bytes (``cut`` says it stopped early).
    requests reads ``content`` through ``raw.stream``; everything else is the raw response's own."""

    def __init__(self, raw: Any, limit: int) -> None:
        self.raw = raw
        self.left = limit
        self.cut = False

    def stream(self, amt: int = 2**16, decode_content: bool | None = None) -> Iterator[bytes]:
        for chunk in self.raw.stream(amt, decode_content=decode_content):
            if not chunk:
                continue
            if len(chunk) > self.left:
                self.cut = True
                if self.left:
                    yield chunk[: self.left]
                self.left = 0
                return
            self.left -= len(chunk)
            yield chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def read_at_most(response: requests.Response, limit: int | None, deadline: float | None = None) -> bool:
    """Read a ``stream=True`` response's body into it, at most ``limit`` bytes (after content
    decoding; None: all of it), by ``deadline`` (``time.monotonic``; see
    ``body_deadline.read_body_by``) when given. Returns whether the body was cut; its connection is
    then closed, not pooled."""
    raw = response.raw
    if limit is None or not hasattr(raw, "stream"):  # whole, or not urllib3's: read as requests would
        if deadline is None:
            response.content  # noqa: B018 -- reads and keeps the body
        else:
            read_body_by(response, deadline)
        return False
    capped = _Capped(raw, limit)
    response.raw = capped
    try:
        if deadline is None:
            response.content  # noqa: B018 -- reads (at most limit bytes) and keeps the body
        else:
            read_body_by(response, deadline)
    finally:
        response.raw = raw
    if capped.cut:
        with contextlib.suppress(Exception):  # the rest stays unread: the connection must go
            raw.close()
            raw.release_conn()
    return capped.cut
