"""The crawl frontier with real workers, judged at the sites (issue 28, item 6 (b), (d), (f)).

Everything is real: one redis-server (state db 0, broker db 1), HTTP sites on their own loopback
addresses (127.0.0.x, one server each, logging every request's arrival time), a proxy farm for the
pool phase, ``celery -A celery_ha worker`` processes running the shipped ``fetch_page`` through
``ctx.fetch``, URLs queued with ``celery-ha enqueue -f`` (which kicks the pump). robots.txt is not
fetched (``CELERY_HA_OBEY_ROBOTS=0``; Scrapy's ``ROBOTSTXT_OBEY`` is off too), so every request a
site sees is a page.

    python benchmarks/frontier_bench.py pool  --repeat 3       # (b) + (d), gate on vs off
    python benchmarks/frontier_bench.py many  --repeat 3       # (f), celery-ha vs Scrapy
    python benchmarks/frontier_bench.py all   --repeat 3 --json /tmp/frontier.json

**pool** ((b) politeness through the proxy pool, (d) slots): one worker ``-c 4``; host A (127.0.0.2)
limited to ``--rate`` (2/1) both by the pool's domain budget (``set_domain_budget``) and, gate on, by
the gate (``hosts set A --rate``): one politeness model, the same number in both; 4 proxies
(127.0.0.20-23); ``--a`` A URLs queued before ``--b`` URLs of an unlimited host B (127.0.0.3). Figures:
the most A requests the site saw in any window of the rate's length (must be <= N), A's rate at the site
over its steady part (its 6th request to its last; ratio to the limit: target >= 90 %), B's finish time
after its enqueue, and the share of pool time spent in tasks while A runs: Σ task runtimes (the
runtime histogram's estimated sum, every task of A and B) / (4 processes x A's span). Every task
does one local fetch of a few ms, so that share is an upper bound of the time a process slept on a
host's politeness. Gate off = the same tree without the gate: the pool refuses A's surplus and the
task retries with backoff.

**many** ((f)): 50 sites (127.0.0.100-149), each allowing 1 request/s (a site logs, it does not
refuse: the figure is what it saw), 40 URLs each, queued host by host (all of the first host, then
the second...). celery-ha: gate on, ``CELERY_HA_HOST_RATE=1/1``, one worker ``-c 8``, no proxies
(direct fetches). Scrapy: one ``scrapy runspider`` with ``DOWNLOAD_DELAY = 1``,
``CONCURRENT_REQUESTS_PER_DOMAIN = 1``, ``DOWNLOAD_DELAY_JITTER = 0`` (Scrapy 2.19's name for
``RANDOMIZE_DOWNLOAD_DELAY = False``; its default, ±50 %, spaces 0.5-1.5 s: below the sites' limit
half the time), no AutoThrottle, ``CONCURRENT_REQUESTS =
16`` (its default; never the bound here: each request takes a few ms), the same URLs in the same
order. Figures: aggregate rate = requests / (last arrival - first arrival) over all sites, and the
mean per-host rate (requests - 1) / (its last - its first); the most requests any site saw inside any
1 s (must be 1), the shortest gap between two requests at one site; the ratio celery-ha / Scrapy.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celery_ha.demo.proxy_farm import ProxyFarm  # noqa: E402
from celery_ha.proxy import ProxyPool  # noqa: E402
from celery_ha.runtime.redis_process import RedisProcess, free_port  # noqa: E402
from celery_ha.state import TaskQueue  # noqa: E402
from celery_ha.state.metrics import read_queue_metrics  # noqa: E402

BIN = Path(sys.executable).parent


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Site:
    """One HTTP server on its own loopback address; logs each request's arrival (time, client ip)."""

    def __init__(self, address: str) -> None:
        self.log: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                now = time.time()
                with site.lock:
                    site.log.append((now, self.client_address[0]))
                data = f"<html><title>{self.path}</title>page</html>".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer((address, 0), Handler)
        self.server.daemon_threads = True
        self.host = f"{address}:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def urls(self, n: int) -> list[str]:
        return [f"http://{self.host}/p/{i}" for i in range(n)]

    def times(self) -> list[float]:
        with self.lock:
            return sorted(t for t, _ in self.log)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def most_in_window(times: list[float], window: float) -> int:
    """The most arrivals inside any half-open interval of ``window`` seconds."""
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


class Workers:
    """Celery worker processes for one namespace; SIGKILLed (their process group) at stop."""

    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.env, self.tmp = env, tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, n: int, concurrency: int, name: str) -> None:
        for i in range(n):
            log = open(self.tmp / f"worker-{name}-{i}.log", "ab")
            self.procs.append(subprocess.Popen(
                [str(BIN / "celery"), "-A", "celery_ha", "worker", "-P", "prefork", "-c", str(concurrency),
                 "-n", f"{name}{i}@bench", "--without-gossip", "--without-mingle", "-l", "warning"],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def wait_ready(self, r: redis.Redis, ns: str, processes: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while int(r.zcard(f"cha:{{{ns}}}:workers")) < processes:
            self.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready after {timeout:.0f}s (logs in {self.tmp})")
            time.sleep(0.2)

    def check(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a worker exited with {proc.returncode} (logs in {self.tmp})")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        self.procs.clear()


def base_env(state_url: str, broker_url: str, ns: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_HA_")}
    env.update({"PYTHONPATH": str(ROOT), "CELERY_HA_REDIS_URL": state_url, "CELERY_BROKER_URL": broker_url,
                "CELERY_HA_NAMESPACE": ns, "CELERY_HA_OBEY_ROBOTS": "0", "PYTHONUNBUFFERED": "1"})
    return env


def enqueue_file(env: dict[str, str], path: Path, urls: list[str]) -> None:
    path.write_text("".join(f"{u}\n" for u in urls))
    subprocess.run([str(BIN / "celery-ha"), "enqueue", "-f", str(path), "--json"], env=env, check=True,
                   capture_output=True)


def wait_for(what: str, done: Any, timeout: float, workers: Workers | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if workers:
            workers.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not done after {timeout:.0f}s")
        time.sleep(0.1)


# ---------------------------------------------------------------------------- (b) + (d)
def settled(q: TaskQueue, total: int) -> bool:
    """Every task completed or dead (gate off, the pool's refusals retry A's tasks, some to death)."""
    stats = q.stats()
    return stats["completed"] + stats["dead"] >= total
def pool_run(server: RedisProcess, tmp: Path, gate: bool, args: Any) -> dict[str, Any]:
    base = server.url.rsplit("/", 1)[0]
    state_url, broker_url = f"{base}/0", f"{base}/1"
    for url in (state_url, broker_url):
        redis.Redis.from_url(url).flushdb()
    ns = "frpool"
    r = redis.Redis.from_url(state_url, decode_responses=True)
    n, per = (int(x) for x in args.rate.split("/"))
    a, b = Site("127.0.0.2"), Site("127.0.0.3")
    farm = ProxyFarm(4, first=20).start()
    env = base_env(state_url, broker_url, ns)
    # The per proxy x domain window is not what is measured: wide enough never to bind (A's limit is
    # its domain budget, B has none); the default (5 per 60 s) would cap A at 4 x 5 per minute.
    env["CELERY_HA_PROXY_RATE"] = "1000/1"
    if gate:
        env["CELERY_HA_HOSTS"] = "1"
    workers = Workers(env, tmp)
    try:
        pool = ProxyPool(r, ns)
        pool.add_many(farm.urls, source="bench-farm")
        pool.set_domain_budget(a.host, args.rate)
        q = TaskQueue(r, ns, host_gate=gate)
        if gate:
            q.hosts.set(a.host, rate=args.rate)
        before = load()
        workers.start(1, 4, "pool")
        workers.wait_ready(r, ns, 4)
        enqueue_file(env, tmp / "a.txt", a.urls(args.a))
        b_at = time.time()
        enqueue_file(env, tmp / "b.txt", b.urls(args.b))
        wait_for("the crawl", lambda: settled(q, args.a + args.b), args.a * per / n * 4 + 120, workers)
        after = load()
        m = read_queue_metrics(r, ns)
        runtime = sum(h.estimated_sum_seconds() for h in m.histograms["runtime"].values())
        dead = q.stats()["dead"]
    finally:
        workers.stop()
        farm.stop()
        a.close()
        b.close()
    ta, tb = a.times(), b.times()
    steady = ta[5:]
    rate = (len(steady) - 1) / (steady[-1] - steady[0])
    span = ta[-1] - ta[0]
    return {"gate": gate, "limit": args.rate, "a_requests": len(ta), "b_requests": len(tb),
            "dead": dead,
            "a_most_in_window": most_in_window(ta, per), "a_rate": rate, "a_ratio": rate / (n / per),
            "a_min_gap": min(y - x for x, y in pairwise(ta)),
            "b_finish_s": tb[-1] - b_at, "a_span_s": span,
            "task_time_share": runtime / (4 * span), "load_before": before, "load_after": after}


def pool_line(row: dict[str, Any]) -> str:
    return (f"gate {'on ' if row['gate'] else 'off'} | A {row['a_requests']} req, most in window "
            f"{row['a_most_in_window']} (limit {row['limit']}), steady {row['a_rate']:.3f}/s = "
            f"{row['a_ratio']:.1%}, min gap {row['a_min_gap'] * 1000:.0f} ms | "
            f"B done {row['b_finish_s']:.1f} s after enqueue | dead {row['dead']} | "
            f"pool time in tasks {row['task_time_share']:.2%} | "
            f"load {row['load_before']} -> {row['load_after']}")


# ---------------------------------------------------------------------------- (f)
SPIDER = '''
import scrapy

class Frontier(scrapy.Spider):
    name = "frontier"
    custom_settings = {
        "DOWNLOAD_DELAY": 1, "CONCURRENT_REQUESTS_PER_DOMAIN": 1, "DOWNLOAD_DELAY_JITTER": 0,
        "AUTOTHROTTLE_ENABLED": False, "ROBOTSTXT_OBEY": False, "LOG_LEVEL": "WARNING",
        "TELNETCONSOLE_ENABLED": False, "RETRY_ENABLED": False,
    }

    async def start(self):  # Scrapy 2.13+: start_requests() is no longer called on its own
        with open(self.urls_file) as fh:
            for line in fh:
                if line.strip():
                    yield scrapy.Request(line.strip(), callback=self.parse, dont_filter=True)

    def parse(self, response):
        yield {"url": response.url}
'''


def many_figures(sites: list[Site], per_host: int) -> dict[str, Any]:
    times = [s.times() for s in sites]
    every = sorted(t for ts in times for t in ts)
    rates = [(len(ts) - 1) / (ts[-1] - ts[0]) for ts in times if len(ts) > 1]
    return {"requests": len(every), "expected": per_host * len(sites),
            "aggregate_rate": (len(every) - 1) / (every[-1] - every[0]),
            "mean_host_rate": statistics.mean(rates),
            "most_in_1s": max(most_in_window(ts, 1.0) for ts in times),
            "min_gap_ms": 1000 * min(y - x for ts in times for x, y in pairwise(ts)),
            "span_s": every[-1] - every[0]}


def many_celery(server: RedisProcess, tmp: Path, sites: list[Site], args: Any) -> dict[str, Any]:
    base = server.url.rsplit("/", 1)[0]
    state_url, broker_url = f"{base}/0", f"{base}/1"
    for url in (state_url, broker_url):
        redis.Redis.from_url(url).flushdb()
    ns = "frmany"
    r = redis.Redis.from_url(state_url, decode_responses=True)
    env = base_env(state_url, broker_url, ns)
    env.update({"CELERY_HA_HOSTS": "1", "CELERY_HA_HOST_RATE": "1/1"})
    workers = Workers(env, tmp)
    try:
        TaskQueue(r, ns, host_gate=True, host_rate="1/1").hosts.set_defaults(rate="1/1")
        before = load()
        workers.start(1, args.concurrency, "many")
        workers.wait_ready(r, ns, args.concurrency)
        urls = [u for s in sites for u in s.urls(args.per_host)]
        enqueue_file(env, tmp / "many.txt", urls)
        total = len(urls)
        wait_for("celery-ha crawl", lambda: sum(len(s.log) for s in sites) >= total,
                 args.per_host * 3 + 120, workers)
        after = load()
    finally:
        workers.stop()
    return {"crawler": "celery-ha", **many_figures(sites, args.per_host), "load_before": before,
            "load_after": after}


def many_scrapy(tmp: Path, sites: list[Site], args: Any) -> dict[str, Any]:
    spider = tmp / "frontier_spider.py"
    spider.write_text(SPIDER)
    urls = tmp / "scrapy-urls.txt"
    urls.write_text("".join(f"{u}\n" for s in sites for u in s.urls(args.per_host)))
    before = load()
    subprocess.run([str(BIN / "scrapy"), "runspider", str(spider), "-a", f"urls_file={urls}",
                    "-s", "LOG_ENABLED=False"], cwd=tmp, check=True, capture_output=True,
                   timeout=args.per_host * 3 + 300)
    return {"crawler": "scrapy", **many_figures(sites, args.per_host), "load_before": before,
            "load_after": load()}


def many_line(row: dict[str, Any]) -> str:
    return (f"{row['crawler']:9} | {row['requests']}/{row['expected']} req in {row['span_s']:.1f} s: "
            f"aggregate {row['aggregate_rate']:.2f}/s = {row['aggregate_rate'] / 50:.1%} of 50/s, mean host "
            f"{row['mean_host_rate']:.3f}/s | most in any 1 s at one site {row['most_in_1s']}, min gap "
            f"{row['min_gap_ms']:.0f} ms | load {row['load_before']} -> {row['load_after']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=("pool", "many", "all"))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--rate", default="2/1", help="pool: A's limit N/S")
    parser.add_argument("--a", type=int, default=100, help="pool: A URLs")
    parser.add_argument("--b", type=int, default=50, help="pool: B URLs")
    parser.add_argument("--hosts", type=int, default=50, help="many: sites")
    parser.add_argument("--per-host", type=int, default=40, help="many: URLs per site")
    parser.add_argument("--concurrency", type=int, default=8, help="many: -c of the celery-ha worker")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="frontier-bench-"))
    server = RedisProcess(port=free_port(), data_dir=tmp / "redis").start()
    rows: list[dict[str, Any]] = []
    print(f"load average at start: {load()}", flush=True)
    try:
        for _ in range(args.repeat):
            if args.phase in ("pool", "all"):
                for gate in (True, False):
                    row = {"phase": "pool", **pool_run(server, tmp, gate, args)}
                    rows.append(row)
                    print(pool_line(row), flush=True)
            if args.phase in ("many", "all"):
                for crawler in ("celery-ha", "scrapy"):
                    sites = [Site(f"127.0.0.{100 + i}") for i in range(args.hosts)]
                    try:
                        row = many_celery(server, tmp, sites, args) if crawler == "celery-ha" else \
                            many_scrapy(tmp, sites, args)
                    finally:
                        for s in sites:
                            s.close()
                    rows.append({"phase": "many", **row})
                    print(many_line(row), flush=True)
    finally:
        server.stop()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
