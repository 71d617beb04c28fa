"""The middleware's record of borrowed proxies: which request holds which lease, and how far it got.

Why a book instead of keeping the lease in ``request.meta``: Scrapy copies meta into every retry,
redirect and ``request.replace()``, so a lease in meta would be returned once per copy. The book is
keyed by the lease token (the only thing meta carries) and matches the *request object* that
borrowed it, so :meth:`take` hands out each lease exactly once, whatever copies exist.

A lease whose request another middleware dropped or replaced is never matched again; the book knows
how far each request got (reached Scrapy's downloader, left it) so :meth:`forgotten` can find those
and the middleware return them with the right outcome instead of letting them block the proxy until
their lock expires.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from scrapy.http import Request

from celery_ha.contrib.scrapy import keys
from celery_ha.proxy import ProxyLease


@dataclass(eq=False)
class Entry:
    """One outstanding lease and the request that holds it (a strong reference: kept alive until
    the lease is returned, so a dropped request cannot vanish with its lease)."""

    lease: ProxyLease
    request: Request
    borrowed_at: float = field(default_factory=time.monotonic)  # just before the acquire: the lease's clock
    reached_at: float | None = None  # the request got to Scrapy's downloader (entered its slot's queue)
    left_at: float | None = None  # the download ended without a response (it raised)


class LeaseBook:
    """Outstanding leases by token. Used from Twisted's reactor thread only (no locking)."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self._entries.values()))

    def add(self, request: Request, lease: ProxyLease, borrowed_at: float | None = None) -> Entry:
        """Record that ``request`` now holds ``lease`` (borrowed at ``borrowed_at``, monotonic; now
        when not given) and mark the request with its token."""
        entry = Entry(lease, request) if borrowed_at is None else Entry(lease, request, borrowed_at)
        self._entries[lease.token] = entry
        request.meta[keys.LEASE] = lease.token
        return entry

    def find(self, request: Request) -> Entry | None:
        """The entry of the lease ``request`` itself borrowed (a copy carrying the token is not it)."""
        token = request.meta.get(keys.LEASE)
        entry = self._entries.get(token) if isinstance(token, str) else None
        return entry if entry is not None and entry.request is request else None

    def take(self, request: Request) -> Entry | None:
        """Remove and return ``request``'s entry: the one time its lease may be returned."""
        entry = self.find(request)
        if entry is not None:
            del self._entries[entry.lease.token]
        return entry

    def superseded(self, request: Request) -> Entry | None:
        """The lease of an earlier pass of this request that will never be used, taken out of the book.

        ``request`` is entering the middleware again carrying a lease token: either it is the very
        request that borrowed (a middleware after ours re-scheduled it), or a copy of one that never
        reached the downloader (``return request.replace(...)`` from a later ``process_request``), or
        a copy of one whose download raised and was handled by a later middleware. A copy of a request
        that is still downloading is left alone.
        """
        token = request.meta.get(keys.LEASE)
        entry = self._entries.get(token) if isinstance(token, str) else None
        if entry is None:
            return None
        if entry.request is not request and entry.reached_at is not None and entry.left_at is None:
            return None
        del self._entries[token]
        return entry

    def forgotten(self, *, stray_after: float, left_grace: float, now: float | None = None) -> list[Entry]:
        """Take out leases no middleware call will return any more.

        * never reached the downloader ``stray_after`` seconds after borrowing: a middleware after
          ours dropped the request (or re-scheduled it and the dupefilter dropped the copy);
        * the download raised more than ``left_grace`` seconds ago and no ``process_exception`` of
          ours saw it: a middleware after ours handled the exception first.

        Pass ``stray_after=0, left_grace=0`` when the engine is idle: then nothing is in flight.
        """
        now = time.monotonic() if now is None else now
        out: list[Entry] = []
        for token, entry in list(self._entries.items()):
            stray = entry.reached_at is None and now - entry.borrowed_at >= stray_after
            failed = entry.left_at is not None and now - entry.left_at >= left_grace
            if stray or failed:
                del self._entries[token]
                out.append(entry)
        return out

    def take_all(self) -> list[Entry]:
        """Every outstanding entry (the spider is closing)."""
        out = list(self._entries.values())
        self._entries.clear()
        return out
