"""What a refused acquire costs Redis when a domain is exhausted, by pool size (issue 30).

Every proxy of a pool of P has used its rate window for one domain (1 request per 10 minutes), so
every acquire for that domain is refused. Two ways, timed in the same run on one redis-server of its
own (free loopback port, no persistence):

- **walk**: the domain's exhausted mark (``dx:<domain>``) is deleted before each acquire, so the
  script walks the pool as it did before the mark existed (loads the cool-downs, reads every proxy id);
- **marked**: the mark set by the walk answers (a few commands, whatever P).

Redis time is the acquire script's own (``INFO commandstats``: ``cmdstat_evalsha`` usec delta per
call), so the loopback round trip is not in it.

    python benchmarks/proxy_exhausted_bench.py --sizes 100,1000,10000 --calls 200
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from celery_ha.base.errors import NoProxyAvailable
from celery_ha.proxy import PoolConfig, ProxyPool
from celery_ha.runtime.redis_process import RedisProcess, free_port

DOMAIN = "busy.example"


def evalsha_usec(r: redis.Redis) -> tuple[int, int]:
    """Calls and µs of the scripts: EVALSHA, or FCALL of the pool's function library (Redis 7)."""
    stats = r.info("commandstats")
    both = [stats.get(f"cmdstat_{c}", {}) for c in ("evalsha", "fcall")]
    return sum(int(s.get("calls", 0)) for s in both), sum(int(s.get("usec", 0)) for s in both)


def refused(pool: ProxyPool, r: redis.Redis, calls: int, walk: bool) -> float:
    """Mean µs of Redis time per refused acquire."""
    mark = pool.prefix + "dx:" + DOMAIN
    spent = 0
    for _ in range(calls):
        if walk:
            r.delete(mark)
        n0, u0 = evalsha_usec(r)
        try:
            pool.acquire(DOMAIN)
        except NoProxyAvailable:
            pass
        else:
            raise AssertionError("the domain should be exhausted")
        n1, u1 = evalsha_usec(r)
        assert n1 - n0 == 1
        spent += u1 - u0
    return round(spent / calls, 1)


def run_size(r: redis.Redis, size: int, calls: int) -> dict[str, object]:
    r.flushall()
    pool = ProxyPool(r, "bench", PoolConfig(rate=(1, 600.0)))
    for start in range(0, size, 1000):
        pool.add_many([f"http://10.{i // 65536}.{i // 256 % 256}.{i % 256}:8080"
                       for i in range(start, min(size, start + 1000))])
    for _ in range(size):
        pool.release(pool.acquire(DOMAIN), ok=True, latency_ms=50, status=200)
    walk = refused(pool, r, calls, walk=True)
    marked = refused(pool, r, calls, walk=False)
    row = {"proxies": size, "walk_us": walk, "marked_us": marked, "ratio": round(walk / marked, 1)}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000", help="Pool sizes, comma separated.")
    parser.add_argument("--calls", type=int, default=200, help="Refused acquires timed per way.")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="proxy-exhausted-"))
    server = RedisProcess(port=free_port(), data_dir=data, binary=shutil.which("redis-server") or "",
                          extra_args=["--save", ""]).start()
    try:
        r = redis.Redis.from_url(server.url, decode_responses=True)
        print(f"redis {r.info('server')['redis_version']}", flush=True)
        for size in args.sizes.split(","):
            run_size(r, int(size), args.calls)
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
