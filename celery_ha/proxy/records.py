"""The stored form of a proxy: what ``add.lua`` receives for one proxy, and its hash decoded back.

The hash (``ProxyKeys.meta``) is written only by the scripts; its fields are ``url``/``masked``/
``source``/``state``, the decayed counts ``s``/``t``/``ln``/``ld`` behind the score, ``lat_ewma``, the
counters ``n_ok``/``n_tr``/``n_blk``/``n_5xx``/``n_acq`` and the times ``ban_until``/``expires_at``/
``last_used_at`` (ms, Redis clock). Decoding tolerates missing or unreadable fields, so a listing
never fails on one odd record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_ha.base.masking import mask_url
from celery_ha.proxy.types import ProxyInfo
from celery_ha.proxy.validation import ProxySpec


def add_item(
    spec: ProxySpec, *, source: str, lifetime: float | None, verify: bool, group: str | None
) -> dict[str, Any]:
    """One entry of ``add.lua``'s JSON list (ARGV[2]); ``lifetime`` in seconds, None = no expiry."""
    item: dict[str, Any] = {
        "id": spec.id,
        "url": spec.url,
        "masked": spec.masked,
        "scheme": spec.scheme,
        "host": spec.host,
        "port": spec.port,
        "user": spec.username,
        "source": source,
        "ttl_ms": int(lifetime * 1000) if lifetime else 0,
        "verify": bool(verify),
    }
    if group:
        item["group"] = group
    return item


def proxy_info(proxy_id: str, fields: Mapping[str, str]) -> ProxyInfo:
    """A :class:`ProxyInfo` from a stored proxy hash (URL masked, numbers rounded for display)."""

    def num(name: str, default: float = 0) -> float:
        try:
            return float(fields.get(name, default))
        except ValueError:
            return default

    t = num("t")
    return ProxyInfo(
        id=proxy_id,
        url=fields.get("masked") or mask_url(fields.get("url", "")),
        state=fields.get("state", "?"),
        source=fields.get("source", ""),
        score=round(num("score"), 4),
        success=round(num("s") / t, 4) if t else 0.0,
        latency_ms=int(num("lat_ewma", -1)),
        ok=int(num("n_ok")),
        transport_errors=int(num("n_tr")),
        blocked=int(num("n_blk")),
        server_errors=int(num("n_5xx")),
        borrowed=int(num("n_acq")),
        ban_until_ms=int(num("ban_until")),
        expires_at_ms=int(num("expires_at")),
        last_used_by=fields.get("last_used_by", ""),
        last_used_at_ms=int(num("last_used_at")),
        ban_reason=fields.get("ban_reason", ""),
    )
