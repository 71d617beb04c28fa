"""Issue 31 items 3 and 5, side by side with their baselines in the same run.

1. Canonicalisation cost per URL: the previous hand-written canonicaliser (kept here as the baseline)
   vs ``base/urls.py``'s ``canonical_url`` (w3lib plus the rules), on URLs that take the general route
   (ports, queries, fragments, tracking parameters) and on the simple shape (the enqueue fast path).
2. Memory of the conditional-request validators (``state/validators.py``, one hash field per task id)
   vs the ``done`` entry every finished dedup URL already costs (a zset member scored by time), per URL,
   on a real redis-server.

Run: ``python benchmarks/recrawl_bench.py [--rounds 7] [--urls 20000] [--entries 200000]``.
Medians of ``--rounds`` alternating rounds (the machine is shared: ratios are what to read).
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlunsplit

import redis

from celery_ha.base.urls import canonical_url, simple_canonical_url
from celery_ha.base.validation import _checked_parts
from celery_ha.runtime.redis_process import RedisProcess, free_port
from celery_ha.state.ids import random_id


def legacy_canonical(url: str) -> str:
    """The canonicaliser issue 31 replaced (validation.canonical_url before it), as the baseline."""
    parts = _checked_parts(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    port = parts.port
    netloc = host if port is None or port == {"http": 80, "https": 443}.get(scheme) else f"{host}:{port}"
    query = urlencode(sorted(parse_qsl(parts.query, keep_blank_values=True)))
    return urlunsplit((scheme, netloc, parts.path or "/", query, ""))


_LEGACY_SIMPLE = re.compile(r"https?://[a-z0-9.-]+(/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*)?")


def legacy_fast(url: str) -> str:
    """The previous enqueue fast path (its regex), falling back to the legacy canonicaliser."""
    m = _LEGACY_SIMPLE.fullmatch(url)
    if m:
        return url if m.group(1) else url + "/"
    return legacy_canonical(url)


def general_urls(n: int) -> list[str]:
    return [f"HTTPS://Shop{i % 97}.Example:443/Cat/{i}/item?b={i}&a=x&utm_source=news&gclid=z{i}#top"
            for i in range(n)]


def per_url_us(fn, urls: list[str]) -> float:
    start = time.perf_counter()
    for u in urls:
        fn(u)
    return (time.perf_counter() - start) / len(urls) * 1e6


def canonical_rounds(rounds: int, n: int) -> None:
    general = general_urls(n)
    simple = [f"https://shop{i % 97}.example/cat/{i}/item" for i in range(n)]

    def fast(u: str) -> str:
        return simple_canonical_url(u) or canonical_url(u)

    rows: dict[str, list[float]] = {"general: legacy": [], "general: w3lib": [], "simple: legacy": [],
                                    "simple: fast path": []}
    for _ in range(rounds):
        rows["general: legacy"].append(per_url_us(legacy_canonical, general))
        rows["general: w3lib"].append(per_url_us(canonical_url, general))
        rows["simple: legacy"].append(per_url_us(legacy_fast, simple))
        rows["simple: fast path"].append(per_url_us(fast, simple))
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"canonicalisation, µs per URL (median of {rounds} rounds of {n} URLs)")
    print(f"  general route: legacy {med['general: legacy']:.2f}, w3lib {med['general: w3lib']:.2f}, "
          f"ratio {med['general: w3lib'] / med['general: legacy']:.2f}x")
    print(f"  simple shape (fast paths): legacy {med['simple: legacy']:.2f}, "
          f"new {med['simple: fast path']:.2f}, "
          f"ratio {med['simple: fast path'] / med['simple: legacy']:.2f}x")


def memory(entries: int) -> None:
    server = RedisProcess(port=free_port(), data_dir=Path(tempfile.mkdtemp()))
    server.start()
    try:
        r = redis.Redis.from_url(server.url)
        version = r.info("server")["redis_version"]
        ids = [random_id() for _ in range(entries)]

        def fill(write) -> float:
            r.flushall()
            base = r.info("memory")["used_memory"]
            pipe = r.pipeline(transaction=False)
            for i, tid in enumerate(ids):
                write(pipe, i, tid)
                if i % 5000 == 4999:
                    pipe.execute()
            pipe.execute()
            return (r.info("memory")["used_memory"] - base) / entries

        done = fill(lambda p, i, t: p.zadd("done", {t: 1_700_000_000_000 + i}))
        print(f"memory per URL on Redis {version} ({entries} entries)")
        print(f"  baseline: a 'done' entry (zset, id -> completion ms): {done:.1f} B")
        for label, value in (("ETag of 16 hex", 'e:"5d8c72a5edda8d6a"'),
                             ("weak ETag of 32 hex", 'e:W/"6f-1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d"'),
                             ("Last-Modified", "m:1700000000")):
            per = fill(lambda p, i, t, v=value: p.hset("valid", t, v))
            print(f"  validator, {label} ({len(value)} chars): {per:.1f} B = {per / done:.2f}x done")
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--urls", type=int, default=20_000)
    parser.add_argument("--entries", type=int, default=200_000)
    args = parser.parse_args()
    canonical_rounds(args.rounds, args.urls)
    memory(args.entries)


if __name__ == "__main__":
    main()
