"""Proxy-pool benchmark: acquire + release pairs per second, and Redis round trips per pair.

Starts its own redis-server, loads 200 proxies, and has 1 and 16 workers (threads and processes) borrow
and return proxies for 20 domains as fast as they can. Round trips are counted on the server
(``INFO commandstats``: EVALSHA calls and ``total_commands_processed`` deltas), not by the client.

    python benchmarks/proxy_bench.py [--seconds 5] [--write]

``--write`` replaces the "## Proxy pool" section of benchmarks/RESULTS.md with the figures.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import random
import re
import sys
import threading
import time
from pathlib import Path

import redis
from redis.utils import HIREDIS_AVAILABLE

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from celery_ha.base.errors import NoProxyAvailable
from celery_ha.proxy import PoolConfig, ProxyPool
from celery_ha.runtime.redis_process import RedisProcess, free_port

PROXIES, DOMAINS = 200, 20
RATE = (100, 1.0)  # generous: the benchmark measures the pool, not the rate limit
COMMAND = "python benchmarks/proxy_bench.py --seconds {seconds} --repeat {repeat} --write"


def make_pool(url: str) -> ProxyPool:
    return ProxyPool(redis.Redis.from_url(url, decode_responses=True), "bench", PoolConfig(rate=RATE))


def run_worker(url: str, seconds: float, seed: int, barrier=None, out=None) -> tuple[int, int]:
    """Borrow/return for ``seconds`` once every worker is ready; returns (pairs, refusals)."""
    pool = make_pool(url)
    rnd = random.Random(seed)
    domains = [f"site{i}.example" for i in range(DOMAINS)]
    pool.client.ping()  # connect before the clock starts
    if barrier is not None:
        barrier.wait(120)
    deadline = time.perf_counter() + seconds
    pairs = refused = 0
    while time.perf_counter() < deadline:
        try:
            lease = pool.acquire(rnd.choice(domains), worker=f"b{seed}")
        except NoProxyAvailable:
            refused += 1
            continue
        pool.release(lease, ok=True, latency_ms=rnd.randint(50, 500), status=200)
        pairs += 1
    if out is not None:
        out.put((pairs, refused))
    return pairs, refused


def server_counters(client: redis.Redis) -> tuple[int, int, float]:
    """(script calls: EVALSHA, or FCALL of the pool's function library on Redis 7; total commands
    incl. those run inside scripts; server CPU seconds)."""
    stats = client.info("commandstats")
    evalsha = sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "fcall"))
    cpu = client.info("cpu")
    return (
        evalsha,
        int(client.info("stats")["total_commands_processed"]),
        float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
    )


def measure(url: str, workers: int, mode: str, seconds: float) -> dict[str, object]:
    admin = redis.Redis.from_url(url)
    admin.config_resetstat()
    load_before = os.getloadavg()[0]
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(workers + 1) if mode == "processes" else threading.Barrier(workers + 1)
    out = ctx.Queue() if mode == "processes" else None
    results: list[tuple[int, int]] = []
    if mode == "threads":
        runners = [
            threading.Thread(target=lambda i=i: results.append(run_worker(url, seconds, i, barrier)))
            for i in range(workers)
        ]
    else:
        runners = [
            ctx.Process(target=run_worker, args=(url, seconds, i, barrier, out)) for i in range(workers)
        ]
    for runner in runners:
        runner.start()
    barrier.wait(120)  # every worker is connected: the clock starts for all at once
    before = server_counters(admin)
    if out is not None:
        results = [out.get(timeout=seconds + 120) for _ in runners]
    for runner in runners:
        runner.join(seconds + 120)
    after = server_counters(admin)
    evalsha = after[0] - before[0]
    pairs = sum(p for p, _ in results)
    refused = sum(f for _, f in results)
    admin.close()
    return {
        "workers": workers,
        "mode": mode,
        "pairs_per_s": pairs / seconds,
        "pairs": pairs,
        "refused": refused,
        # one EVALSHA per acquire (granted or refused) and one per release
        "evalsha_per_pair": (evalsha - refused) / max(1, pairs),
        # commands the scripts ran inside Redis (not round trips; shows the scripts' own weight)
        "inner_per_pair": (after[1] - before[1] - evalsha) / max(1, pairs),
        "redis_cpu_us_per_pair": (after[2] - before[2]) * 1e6 / max(1, pairs),
        "load": f"{load_before:.1f}",
    }


def seed(url: str) -> None:
    pool = make_pool(url)
    pool.add_many(
        [f"http://user:pw@127.0.{i // 250}.{i % 250 + 1}:8080" for i in range(PROXIES)], source="bench"
    )


def section(rows: list[dict[str, object]], seconds: float, repeat: int) -> str:
    lines = [
        "## Proxy pool",
        "",
        f"Command: `{COMMAND.format(seconds=f'{seconds:g}', repeat=repeat)}`",
        "",
        f"{PROXIES} proxies x {DOMAINS} domains, rate {RATE[0]}/{RATE[1]:g} s per proxy x domain, "
        f"{seconds:g} s per run, own redis-server ({redis_version}, loopback) on the same "
        f"{os.cpu_count()}-core machine, {platform.python_implementation()} {platform.python_version()}, "
        f"redis-py {redis.__version__} ({'hiredis' if HIREDIS_AVAILABLE else 'pure-Python'} parser). "
        f"Median of {repeat} runs per row; the machine is shared, so the load average is shown.",
        "",
        "| workers | kind | pairs/s (median) | best run | round trips per pair "
        "| commands inside scripts per pair | Redis CPU per pair | refusals | load avg at start |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['workers']} | {row['mode']} | {row['pairs_per_s']:,.0f} | {row['best']:,.0f} "
            f"| {row['evalsha_per_pair']:.2f} "
            f"| {row['inner_per_pair']:.1f} | {row['redis_cpu_us_per_pair']:.0f} us | {row['refused']} "
            f"| {row['load']} |"
        )
    lines += [
        "",
        "Round trips are counted by the server (`INFO commandstats`: EVALSHA calls minus refusals, "
        "divided by "
        'pairs): acquire is one EVALSHA and release is one EVALSHA. "Commands inside scripts" is the '
        "`total_commands_processed` delta minus the EVALSHAs, i.e. work done inside the two scripts, not "
        "extra round trips. Target: >= 3,000 pairs/s with 16 workers on 2 cores.",
        "",
    ]
    return "\n".join(lines)


def write_section(text: str) -> None:
    path = Path(__file__).resolve().parent / "RESULTS.md"
    current = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n\n"
    pattern = re.compile(r"^## Proxy pool\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(current):
        updated = pattern.sub(lambda _: text + "\n", current, count=1)
    else:
        updated = current.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(updated.rstrip("\n") + "\n", encoding="utf-8")


redis_version = "redis"


def main() -> None:
    global redis_version
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration (median reported)")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    server = RedisProcess(port=free_port()).start()
    try:
        admin = redis.Redis.from_url(server.url)
        redis_version = f"Redis {admin.info('server')['redis_version']}"
        admin.close()
        seed(server.url)
        rows = []
        for workers, mode in [(1, "threads"), (16, "threads"), (1, "processes"), (16, "processes")]:
            runs = sorted(
                (measure(server.url, workers, mode, args.seconds) for _ in range(args.repeat)),
                key=lambda row: float(row["pairs_per_s"]),
            )  # type: ignore[arg-type]
            row = runs[len(runs) // 2]  # the median run
            row["best"] = runs[-1]["pairs_per_s"]
            rows.append(row)
            print(
                f"{workers:>2} {row['mode']:<9} {row['pairs_per_s']:>9,.0f} pairs/s "
                f"(median of {args.repeat}, "
                f"best {row['best']:,.0f})  round trips/pair {row['evalsha_per_pair']:.2f}  "
                f"inner cmds/pair {row['inner_per_pair']:.1f}  "
                f"redis cpu/pair {row['redis_cpu_us_per_pair']:.0f} us  refused {row['refused']}  "
                f"load {row['load']}",
                flush=True,
            )
        text = section(rows, args.seconds, args.repeat)
        if args.write:
            write_section(text)
            print("wrote benchmarks/RESULTS.md (## Proxy pool)")
        else:
            print(text)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
