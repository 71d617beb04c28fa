"""A polite crawl against its budget: N proxies, a site allowing R requests per W seconds per client IP.

The budget of the crawl is N × R / W requests per second at the site. A crawl that is polite *and*
efficient gets close to it (target: ≥ 90 %) without ever tripping the site's limit (target: 429s
< 0.5 % of requests). Everything is real: one redis-server (state db 0, broker db 1), the demo site
(``celery_ha.demo.site.DemoSite`` with ``rate_limit=(R, W)``, counting per client IP in a sliding
window of its own, on its own clock) and proxy farm (``ProxyFarm(N)``, proxy i leaving from
127.0.0.(2+i)) in this process, and real ``celery -A celery_ha worker`` processes running the shipped
``fetch_page`` task through ``ctx.fetch`` and the pool, with ``CELERY_HA_PROXY_RATE=R/W``. The URLs go
in through ``celery-ha enqueue -f`` (which kicks the pump), more than the run can fetch, so the
crawl never runs dry.

    python benchmarks/polite_bench.py                          # N = 4, 12, 48; ~90 s per N
    python benchmarks/polite_bench.py --proxies 12 --seconds 30 --rate 12=5/2
    python benchmarks/polite_bench.py --repeat 2 --json /tmp/polite.json
    python benchmarks/polite_bench.py --proxies 4 12 --gate both   # each N with the host gate off, then on

``--gate on`` runs the workers and the enqueue with the host gate on (``CELERY_HA_HOSTS=1``, no host
limit: the pool's per-IP windows are the politeness; a refusal of the pool then defers the host
instead of the task waiting for a slot); ``both`` runs each N both ways, side by side.

Measured at the site, from its request log (arrival times): the steady state starts ``--warmup``
seconds after the first request reached the site (ramp-up: workers' first claims, robots.txt, the
first burst of every slot) and lasts ``--seconds``; the workers are SIGKILLed after it, so there is
no ramp-down inside the interval. Reported per N: requests/s in the interval and its ratio to the
budget — from the slots' cycle times (Σ over IPs of R / mean(t[i+R] − t[i]), free of the interval's
edges; see :func:`cycle_rate`) and, as a check, the plain count of arrivals in the interval over its
length —, 429s in the interval and over the whole run, the most requests one IP sent inside any W
seconds (must be ≤ R), and the mean time a slot stayed idle per cycle (mean cycle − W: the pool's
and the workers' reaction time, which is what the ratio loses).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celery_ha.base.validation import parse_rate  # noqa: E402
from celery_ha.demo.proxy_farm import ProxyFarm  # noqa: E402
from celery_ha.demo.site import DemoSite, SiteRequest  # noqa: E402
from celery_ha.proxy import PoolConfig, ProxyPool  # noqa: E402
from celery_ha.runtime.redis_process import RedisProcess, free_port  # noqa: E402

BIN = Path(sys.executable).parent
#: Per-IP limits per N: R = 5 per 2 s while N × R / W stays within what two shared cores run through
#: Celery (≈ 60–80 page tasks/s, benchmarks/RESULTS.md); 48 proxies at 5 per 2 s would ask 120/s.
DEFAULT_RATES = {4: "5/2", 12: "5/2", 48: "5/6"}


def load() -> str:
    """The 1, 5 and 15 minute load averages, as text for the report."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def max_in_window(times: list[float], window: float) -> int:
    """The most arrivals inside any half-open interval of ``window`` seconds (the site's own rule:
    a hit older than ``window`` no longer counts)."""
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def cycles(by_ip: dict[str, list[float]], limit: int) -> dict[str, list[float]]:
    """Per IP, every ``t[i+R] − t[i]``: the time one of its R slots took to serve a request and be
    used again (≥ W when the crawl is polite)."""
    return {ip: [ts[i + limit] - ts[i] for i in range(len(ts) - limit)] for ip, ts in by_ip.items()}


def cycle_rate(by_ip: dict[str, list[float]], limit: int) -> float:
    """Requests/s from the slots' cycle times: Σ over IPs of R / mean cycle.

    Why not only "requests in the interval / its length": every slot starts in the same instant, so
    the requests come in bursts of N × R that stay in phase for many windows, and an interval edge
    that falls just before or after a burst moves the count by up to N × R (5 % of a 60 s run at W = 2
    s). The cycle time has no edge.
    """
    return sum(limit / statistics.mean(c) for c in cycles(by_ip, limit).values() if c)


def analyse(log: list[SiteRequest], start: float, seconds: float, n: int, limit: int,
            window: float) -> dict[str, Any]:
    """The figures of one run from the site's log, steady state = [start, start + seconds)."""
    steady = [r for r in log if start <= r.time < start + seconds]
    by_ip: dict[str, list[float]] = defaultdict(list)
    for r in log:
        if r.status != 429:
            by_ip[r.client_ip].append(r.time)
    budget = n * limit / window
    count_rate = len(steady) / seconds
    steady_429 = sum(1 for r in steady if r.status == 429)
    all_429 = sum(1 for r in log if r.status == 429)
    steady_ip: dict[str, list[float]] = defaultdict(list)
    for r in steady:
        if r.status != 429:
            steady_ip[r.client_ip].append(r.time)
    rate = cycle_rate(steady_ip, limit)
    gaps = [g for c in cycles(steady_ip, limit).values() for g in c]
    return {
        "proxies": n, "limit": limit, "window": window, "budget_per_s": budget,
        "steady_seconds": seconds, "steady_requests": len(steady), "rate_per_s": rate,
        "ratio": rate / budget, "count_rate_per_s": count_rate, "count_ratio": count_rate / budget,
        "steady_429": steady_429,
        "steady_429_pct": 100.0 * steady_429 / max(1, len(steady)),
        "all_requests": len(log), "all_429": all_429, "all_429_pct": 100.0 * all_429 / max(1, len(log)),
        "ips": len(by_ip), "max_per_ip_window": max((max_in_window(ts, window) for ts in by_ip.values()),
                                                    default=0),
        "idle_ms_per_cycle": 1000.0 * (statistics.mean(gaps) - window) if gaps else float("nan"),
        "min_cycle_s": min(gaps, default=float("nan")),
    }


class Run:
    """One N: a fresh namespace, site, farm and workers; measures, then tears everything down."""

    def __init__(self, server: RedisProcess, tmp: Path, n: int, rate: tuple[int, float], args: Any,
                 gate: bool = False) -> None:
        base = server.url.rsplit("/", 1)[0]
        self.state_url, self.broker_url = f"{base}/0", f"{base}/1"
        self.tmp, self.n, self.args = tmp, n, args
        self.limit, self.window = int(rate[0]), float(rate[1])
        self.ns = f"polite{n}"
        self.r = redis.Redis.from_url(self.state_url, decode_responses=True)
        self.procs: list[subprocess.Popen[bytes]] = []
        rate_text = f"{self.limit}/{self.window:g}"
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "CELERY_HA_REDIS_URL": self.state_url,
                    "CELERY_BROKER_URL": self.broker_url, "CELERY_HA_NAMESPACE": self.ns,
                    "CELERY_HA_PROXY_RATE": rate_text, "PYTHONUNBUFFERED": "1"}
        self.gate = gate
        if gate:
            self.env["CELERY_HA_HOSTS"] = "1"

    def run(self) -> dict[str, Any]:
        for url in (self.state_url, self.broker_url):
            redis.Redis.from_url(url).flushdb()
        budget = self.n * self.limit / self.window
        pages = int(budget * (self.args.warmup + self.args.seconds + 30) * 1.5) + 100
        site = DemoSite(total=pages, page_size=20, rate_limit=(self.limit, self.window)).start()
        farm = ProxyFarm(self.n, first=2).start()
        try:
            pool = ProxyPool(self.r, self.ns, PoolConfig(rate=(self.limit, self.window)))
            pool.add_many(farm.urls, source="bench-farm")
            load_before = load()
            for i in range(self.args.workers):
                self._worker(i)
            self._wait_ready(self.args.workers * self.args.concurrency)
            urls = self.tmp / f"urls-{self.n}.txt"
            urls.write_text("".join(f"{site.case_url(i)}\n" for i in range(pages)))
            subprocess.run([str(BIN / "celery-ha"), "enqueue", "-f", str(urls), "--json"], env=self.env,
                           check=True, capture_output=True)
            first = self._first_request(site)
            start = first + self.args.warmup
            end = start + self.args.seconds
            while time.time() < end + 0.5:
                self._check_alive()
                time.sleep(0.25)
            load_during = load()
            self._stop_workers()
            row = analyse(site.requests, start, self.args.seconds, self.n, self.limit, self.window)
            stats = self.r.hgetall(f"cha:{{{self.ns}}}:px:stats")
            row.update({"load_before": load_before, "load_after": load_during,
                        "pool_refusals": int(stats.get("no_proxy", 0)),
                        "pool_blocked": int(stats.get("out_blocked", 0)),
                        "workers": self.args.workers, "concurrency": self.args.concurrency,
                        "gate": self.gate})
            return row
        finally:
            self._stop_workers()
            farm.stop()
            site.stop()

    # ------------------------------------------------------------------ workers
    def _worker(self, i: int) -> None:
        log = open(self.tmp / f"worker-{self.n}-{i}.log", "ab")
        self.procs.append(subprocess.Popen(
            [str(BIN / "celery"), "-A", "celery_ha", "worker", "-P", "prefork",
             "-c", str(self.args.concurrency), "-n", f"polite{i}@bench", "--without-gossip",
             "--without-mingle", "-l", "warning"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def _check_alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a worker exited with {proc.returncode} (logs in {self.tmp})")

    def _wait_ready(self, processes: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while int(self.r.zcard(f"cha:{{{self.ns}}}:workers")) < processes:
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready after {timeout:.0f}s (logs in {self.tmp})")
            time.sleep(0.2)

    def _first_request(self, site: DemoSite, timeout: float = 60.0) -> float:
        deadline = time.monotonic() + timeout
        while True:
            log = site.requests
            if log:
                return log[0].time
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no request reached the site within {timeout:.0f}s")
            time.sleep(0.05)

    def _stop_workers(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        self.procs.clear()


def report_line(row: dict[str, Any]) -> str:
    """One run on one line."""
    gate = "on " if row.get("gate") else "off"
    return (f"gate {gate} N={row['proxies']:3} limit {row['limit']}/{row['window']:g}s budget "
            f"{row['budget_per_s']:6.1f}/s | steady {row['rate_per_s']:6.1f}/s = {row['ratio']:.1%} of "
            f"budget (count {row['count_ratio']:.1%}) | 429s {row['steady_429']} "
            f"({row['steady_429_pct']:.2f} %) steady, {row['all_429']} of {row['all_requests']} overall | "
            f"max/IP/window {row['max_per_ip_window']} | idle/cycle {row['idle_ms_per_cycle']:.0f} ms | "
            f"refusals {row['pool_refusals']} | load {row['load_before']} -> {row['load_after']}")


def parse_rates(items: list[str]) -> dict[int, tuple[int, float]]:
    """``N=R/W`` overrides over :data:`DEFAULT_RATES`."""
    rates = {n: parse_rate(r, "rate") for n, r in DEFAULT_RATES.items()}
    for item in items:
        n, _, rate = item.partition("=")
        rates[int(n)] = parse_rate(rate, f"rate for N={n}")
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--proxies", type=int, nargs="+", default=[4, 12, 48], help="values of N")
    parser.add_argument("--rate", action="append", default=[], metavar="N=R/W",
                        help=f"per-IP limit for one N (site and pool alike); defaults {DEFAULT_RATES}; "
                             "an N without a default takes 5/2")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the steady state measured")
    parser.add_argument("--warmup", type=float, default=10.0,
                        help="seconds after the first request that are not measured")
    parser.add_argument("--workers", type=int, default=1, help="celery worker processes")
    parser.add_argument("--concurrency", type=int, default=8, help="-c of each worker")
    parser.add_argument("--repeat", type=int, default=1, help="runs per N")
    parser.add_argument("--redis-server", help="redis-server binary (default: the one the tests use)")
    parser.add_argument("--gate", choices=("off", "on", "both"), default="off",
                        help="the host gate in the workers and the enqueue (both: each N both ways)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rates = parse_rates(args.rate)

    tmp = Path(tempfile.mkdtemp(prefix="polite-bench-"))
    options = {"binary": args.redis_server} if args.redis_server else {}
    server = RedisProcess(port=free_port(), data_dir=tmp / "redis", **options).start()
    rows: list[dict[str, Any]] = []
    print(f"load average at start: {load()}", flush=True)
    try:
        for _ in range(args.repeat):
            for n in args.proxies:
                rate = rates.get(n, (5, 2.0))
                for gate in {"off": (False,), "on": (True,), "both": (False, True)}[args.gate]:
                    row = Run(server, tmp, n, rate, args, gate).run()
                    rows.append(row)
                    print(report_line(row), flush=True)
    finally:
        server.stop()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
