"""Check the crawl's output against the site: nothing lost, nothing doubled.

The site knows every case it lists; each case must appear in the sink exactly once as a list entry
(key ``id:case-N``) and exactly once as a detail page (key = its URL), except pages the site answers
404 on purpose, which must end in the dead-letter set with that reason. Anything else missing is
lost; any case seen twice (under any key) is a duplicate.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis

from celery_ha.state import TaskQueue
from celery_ha.state.sink import iter_items

_CASE_URL = re.compile(r"/case/(\d+)$")


@dataclass
class Verification:
    """The numbers the report prints and the verdict it ends with."""

    expected_pages: int
    detail_items: int = 0
    list_items: int = 0
    items: int = 0
    lost: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    expected_dead: int = 0
    dead: dict[str, str] = field(default_factory=dict)  # url -> reason
    log_mismatch: int = 0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicates or self.unexpected or self.log_mismatch)


def verify(client: redis.Redis, queue: TaskQueue, namespace: str, site_url: str, total: int,
           permanent: set[int]) -> Verification:
    """Compare the sink of ``namespace`` with the ``total`` cases of the site at ``site_url``."""
    result = Verification(expected_pages=total - len(permanent), expected_dead=len(permanent))
    detail: Counter[int] = Counter()
    listed: Counter[str] = Counter()
    for key, item in iter_items(client, namespace, with_keys=True):
        result.items += 1
        match = _CASE_URL.search(str(item.get("url", ""))) if isinstance(item, dict) else None
        if key.startswith("id:"):
            listed[key[3:]] += 1
        elif match and str(item.get("url", "")).startswith(site_url):
            detail[int(match.group(1))] += 1
        else:
            result.unexpected.append(key)
    result.detail_items = sum(detail.values())
    result.list_items = sum(listed.values())
    result.log_mismatch = sum(abs(int(client.llen(k.item_log)) - int(client.hlen(k.items)))
                              for k in queue.shard_keys())
    dead = queue.dead(limit=100_000)
    result.dead = {t.url: t.error or "?" for t in dead}
    dead_cases = {int(m.group(1)) for t in dead if (m := _CASE_URL.search(t.url))}
    for n in range(total):
        case_id = f"case-{n:06d}"
        if listed[case_id] == 0:
            result.lost.append(f"list entry {case_id}")
        elif listed[case_id] > 1:
            result.duplicates.append(f"list entry {case_id} x{listed[case_id]}")
        if n in permanent:
            if detail[n]:
                result.unexpected.append(f"page {n} should have been 404")
            elif n not in dead_cases:
                result.lost.append(f"page {n} (404) is not in dead letters")
            continue
        if detail[n] == 0:
            result.lost.append(f"page {n}" + (" (dead)" if n in dead_cases else ""))
        elif detail[n] > 1:
            result.duplicates.append(f"page {n} x{detail[n]}")
    extra = [n for n in detail if not 0 <= n < total]
    result.unexpected += [f"page {n} is not on the site" for n in extra]
    return result


def reasons(dead: dict[str, str]) -> dict[str, int]:
    """Dead letters grouped by reason, with URLs and numbers stripped so alike errors group."""
    counts: Counter[str] = Counter()
    for error in dead.values():
        counts[re.sub(r"\d{5,}", "N", re.sub(r"https?://\S+", "URL", error))[:80]] += 1
    return dict(counts.most_common())


def as_dict(v: Verification) -> dict[str, Any]:
    return {"ok": v.ok, "expected_pages": v.expected_pages, "detail_items": v.detail_items,
            "list_items": v.list_items, "items": v.items, "lost": len(v.lost),
            "duplicates": len(v.duplicates),
            "unexpected": len(v.unexpected), "expected_dead": v.expected_dead, "dead": len(v.dead)}
