"""The values the pool hands out: a lease on one proxy × domain, and a proxy as shown to people.

Both keep credentials out of anything printed: a lease carries the real URL (requests needs it) but
never shows it, and :class:`ProxyInfo` only ever holds the masked URL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from celery_ha.base.masking import mask_url


@dataclass(frozen=True)
class ProxyLease:
    """One borrowed proxy × domain. Pass it back to :meth:`ProxyPool.release` exactly once.

    ``url`` carries the credentials (requests needs them); it is excluded from ``repr``.
    """

    proxy_id: str
    domain: str
    token: str
    url: str = field(repr=False)
    worker: str = ""
    acquired_at_ms: int = 0
    expires_at_ms: int = 0

    @property
    def seconds(self) -> float:
        """How long the lease's lock lasts from its acquire (both ends on Redis's clock: no skew)."""
        return max(0.0, (self.expires_at_ms - self.acquired_at_ms) / 1000.0)

    @property
    def masked_url(self) -> str:
        """The URL as it may be shown or logged (password replaced by ``***``)."""
        return mask_url(self.url)

    @property
    def proxies(self) -> dict[str, str]:
        """The ``proxies=`` mapping for requests."""
        return {"http": self.url, "https": self.url}

    def __repr__(self) -> str:
        return (
            f"ProxyLease(proxy_id={self.proxy_id!r}, domain={self.domain!r}, url={self.masked_url!r}, "
            f"worker={self.worker!r}, expires_at_ms={self.expires_at_ms})"
        )


@dataclass(frozen=True)
class ProxyInfo:
    """A proxy as shown to people (CLI ``proxies list``): credentials always masked."""

    id: str
    url: str  # masked
    state: str
    source: str
    score: float
    success: float  # decayed successes / results, without the prior
    latency_ms: int  # decayed average, -1 = unknown
    ok: int
    transport_errors: int
    blocked: int
    server_errors: int
    borrowed: int
    ban_until_ms: int
    expires_at_ms: int
    last_used_by: str
    last_used_at_ms: int
    ban_reason: str

    def to_dict(self) -> dict[str, Any]:
        """Plain fields for JSON output (``proxies list --json``); the URL is already masked."""
        return dict(self.__dict__)
