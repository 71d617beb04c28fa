"""Health checks: probe proxies whose temporary ban is over and new proxies on probation.

A ban running out does not put a proxy back in rotation by itself: it must first fetch ``check_url``
through the proxy. Pass → available again (the check counts as a success, so a restored proxy starts with
a fair score); fail → banned again with a longer backoff, permanently after too many bans (a free-list
proxy failing its first check is banned for good). Meant to run from Celery beat
(``tasks/maintenance.py``); safe to run from several places at once, because each proxy is claimed
atomically before it is probed. Where no check runs (no ``CELERY_HA_PROXY_CHECK_URL``:
``PoolConfig.unban_by_time``), the pool's housekeeping ends due bans and admits new proxies instead,
unchecked, since nothing else ever would.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import requests

from celery_ha.base.errors import InvalidInput
from celery_ha.base.masking import mask_url
from celery_ha.base.validation import check_int, check_number
from celery_ha.proxy.pool import ProxyPool

log = logging.getLogger(__name__)


@dataclass
class HealthReport:
    """What one :func:`check_proxies` run did. Ids only, never URLs."""

    checked: int = 0
    restored: list[str] = field(default_factory=list)
    demoted: dict[str, str] = field(default_factory=dict)  # id -> new state (tban / pban)

    def to_dict(self) -> dict[str, object]:
        """Plain fields for JSON output and a Celery task result."""
        return {"checked": self.checked, "restored": self.restored, "demoted": self.demoted}


def probe(
    url: str, check_url: str, timeout: float, expect_status: int = 200, expect_text: str | None = None
) -> tuple[bool, float]:
    """One GET of ``check_url`` through proxy ``url``; returns (passed, latency ms)."""
    started = time.monotonic()
    try:
        with requests.Session() as session:
            session.trust_env = False
            response = session.get(
                check_url, proxies={"http": url, "https": url}, timeout=timeout, allow_redirects=False
            )
            passed = response.status_code == expect_status and (
                expect_text is None or expect_text in response.text
            )
    except requests.RequestException:
        passed = False
    return passed, (time.monotonic() - started) * 1000.0


def check_proxies(
    pool: ProxyPool,
    check_url: str,
    concurrency: int = 8,
    timeout: float = 5.0,
    *,
    limit: int = 200,
    expect_status: int = 200,
    expect_text: str | None = None,
) -> HealthReport:
    """Probe up to ``limit`` due proxies (expired temporary bans, then new ones), ``concurrency`` at a time,
    each with ``timeout`` seconds; restore or demote each one. Returns a :class:`HealthReport`.
    """
    if not isinstance(check_url, str) or not check_url.startswith(("http://", "https://")):
        shown = mask_url(check_url) if isinstance(check_url, str) else type(check_url).__name__
        raise InvalidInput(f"check_url must be an http(s) URL, got {shown!r}")
    concurrency = check_int("concurrency", concurrency, 1, 1000)
    limit = check_int("limit", limit, 1, 100_000)
    timeout = check_number("timeout", timeout, 0.001, 3600, unit="seconds")
    # The claim outlives every probe, so a second checker never picks these proxies up meanwhile; at
    # most a day (health_claim's bound): a slower run's late results are skipped by their claim stamps.
    claim_seconds = min(86_400.0, timeout * (limit / concurrency + 2) + 5)
    due = pool.claim_for_check(limit=limit, claim_seconds=claim_seconds)
    report = HealthReport(checked=len(due))
    if not due:
        return report

    def run(item: tuple[str, str, str, str, str]) -> tuple[str, str]:
        pid, url, _zone, _source, claim = item
        passed, latency = probe(url, check_url, timeout, expect_status, expect_text)
        return pid, pool.record_check(pid, passed, latency, claim)

    with ThreadPoolExecutor(max_workers=min(concurrency, len(due)), thread_name_prefix="proxy-check") as ex:
        for pid, state in ex.map(run, due):
            if state == "avail":
                report.restored.append(pid)
            elif state != "skip":
                report.demoted[pid] = state
    log.info(
        "proxy health check: %d checked, %d restored, %d demoted",
        report.checked,
        len(report.restored),
        len(report.demoted),
    )
    return report
