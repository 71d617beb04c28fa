"""Monitoring benchmark: what a Prometheus scrape costs at 10k and 1M tasks, and what the histogram
counters added to the transition scripts cost the task lifecycle, against a checkout of the code
without them (``--baseline-rev``), side by side in one run on one redis-server.

    python benchmarks/metrics_bench.py                         # 10k and 1M tasks, baseline HEAD
    python benchmarks/metrics_bench.py --quick                 # 10k and 100k, fewer rounds (< 1 min)
    python benchmarks/metrics_bench.py --baseline-rev 30b6476  # the commit before the monitoring work

* Scrape: one namespace holds N tasks (queued over 8 priorities, some completed and dead, 4 task
  names, 12 proxies over 3 domains); the time of ``generate_latest`` over celery-ha web's collector
  (median of 30), and the commands Redis ran per scrape (``total_commands_processed`` delta).
* Lifecycle: single-thread ``claim_next`` + ``complete``, the chained ``complete_and_claim``, and
  the Celery path (``dispatch`` then ``claim`` + ``complete``), per task. The baseline tree is
  ``git archive <rev> celery_ha`` unpacked in a temporary folder (no git state changes); each round
  runs the baseline and the working tree in turn (ABBA order), in child processes, on fresh namespaces; the
  ratio is the median over the rounds of ours / baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent


def child(port: int, n: int, mode: str) -> None:
    """One timed lifecycle run with whichever ``celery_ha`` is first on sys.path; prints JSON."""
    import redis

    from celery_ha.state import TaskQueue

    client = redis.Redis(port=port, decode_responses=True)
    q = TaskQueue(client, f"life-{uuid.uuid4().hex[:8]}", lease_ttl=3600)
    q.enqueue_many([f"https://example.com/case/{i}" for i in range(n)], task="detail_page")
    for _ in range(50):  # warm the scripts and the connection
        q.complete(q.claim_next("warm"))
    n -= 50
    client.config_resetstat()  # server-side script time of this run only (the server is private)
    started = time.perf_counter()
    if mode == "claim+complete":
        for _ in range(n):
            q.complete(q.claim_next("w1"))
    elif mode == "chained":
        lease = q.claim_next("w1")
        for _ in range(n - 1):
            lease = q.complete_and_claim(lease)
        q.complete(lease)
    else:  # dispatch: the Celery path, one pump batch per 100 tasks
        done = 0
        while done < n:
            for d in q.dispatch(window=min(100, n - done)):
                q.complete(q.claim(d.task_id, "w1"))
                done += 1
    took = time.perf_counter() - started
    commands = int(client.info("stats")["total_commands_processed"]) - 1  # this INFO counts too
    stats = client.info("commandstats")
    scripts = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall")
    script_us = sum(v["usec"] for k, v in stats.items() if k in scripts)
    print(json.dumps({"us_per_task": took / n * 1e6, "server_us_per_task": script_us / n,
                      "commands_per_task": commands / n,
                      "file": __import__("celery_ha").__file__}))


def _load_scripts(tree: Path) -> None:
    sys.path.insert(0, str(tree))


def populate(client: Any, ns: str, n: int) -> None:
    from celery_ha.proxy import ProxyPool
    from celery_ha.state import TaskQueue

    q = TaskQueue(client, ns, lease_ttl=3600)
    names = ["fetch_page", "crawl_list", "fetch_image", "fetch_pdf"]
    batch = 5000
    for start in range(0, n, batch):
        q.enqueue_many([{"url": f"https://example.com/{ns}/{i}", "task": names[i % 4], "priority": i % 8}
                        for i in range(start, min(n, start + batch))], batch_size=batch)
    for i in range(2000):
        lease = q.claim_next("w1")
        if i % 40 == 0:
            q.fail(lease, "HTTP 404", retry=False)
        else:
            q.complete(lease)
    for _ in range(16):
        q.claim_next("w2")  # leases held
    pool = ProxyPool(client, ns)
    pool.add_many([f"http://127.0.0.{2 + i}:8001" for i in range(12)])
    for i in range(150):  # under the default 5/60 s per proxy x domain
        pool.release(pool.acquire(f"site{i % 3}.example", ttl=600), ok=True, status=200, latency_ms=80)


def scrape_phase(port: int, sizes: list[int], scrapes: int) -> list[dict[str, Any]]:
    import redis
    from prometheus_client import CollectorRegistry, generate_latest

    from celery_ha.monitoring.collector import Source, StateCollector

    client = redis.Redis(port=port, decode_responses=True)
    out = []
    for n in sizes:
        client.flushall()
        t0 = time.perf_counter()
        populate(client, "scrape", n)
        setup = time.perf_counter() - t0
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StateCollector(Source(client, "scrape", 30.0)))
        generate_latest(registry)  # warm
        before = int(client.info("stats")["total_commands_processed"])
        times = []
        for _ in range(scrapes):
            t = time.perf_counter()
            body = generate_latest(registry)
            times.append(time.perf_counter() - t)
        after = int(client.info("stats")["total_commands_processed"])
        commands = (after - before - 1) / scrapes  # the INFO above counts once
        out.append({"tasks": n, "median_ms": statistics.median(times) * 1000, "max_ms": max(times) * 1000,
                    "commands_per_scrape": commands, "bytes": len(body), "setup_s": setup,
                    "used_memory_mb": int(client.info("memory")["used_memory"]) / 2**20})
        print(f"  scrape at {n:>9,} tasks: median {out[-1]['median_ms']:.2f} ms, "
              f"{commands:.0f} commands, {len(body):,} bytes", flush=True)
    client.flushall()
    return out


def lifecycle_phase(port: int, baseline: Path, n: int, rounds: int) -> dict[str, Any]:
    results: dict[str, dict[str, list[float]]] = {}
    for mode in ("claim+complete", "chained", "dispatch"):
        per = results.setdefault(mode, {"baseline": [], "ours": [], "baseline_server": [],
                                        "ours_server": [], "baseline_commands": [], "ours_commands": []})
        for r in range(rounds):
            sides = [("baseline", baseline), ("ours", ROOT)]
            for side, tree in sides if r % 2 == 0 else sides[::-1]:  # ABBA: no side always runs second
                env = {**os.environ, "PYTHONPATH": str(tree)}
                out = subprocess.run([sys.executable, __file__, "--child", str(port), str(n), mode], env=env,
                                     capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
                doc = json.loads(out.stdout.strip().splitlines()[-1])
                assert doc["file"].startswith(str(tree)), (side, doc["file"])
                per[side].append(doc["us_per_task"])
                per[f"{side}_server"].append(doc["server_us_per_task"])
                per[f"{side}_commands"].append(doc["commands_per_task"])
        ratios = [o / b for o, b in zip(per["ours"], per["baseline"], strict=True)]
        server = [o / b for o, b in zip(per["ours_server"], per["baseline_server"], strict=True)]
        per["ratio"], per["server_ratio"] = ratios, server
        print(f"  {mode:>15}: client {statistics.median(per['baseline']):.1f} -> "
              f"{statistics.median(per['ours']):.1f} us/task, ours/baseline {statistics.median(ratios):.3f} "
              f"(rounds {', '.join(f'{r:.2f}' for r in ratios)}); scripts in Redis "
              f"{statistics.median(per['baseline_server']):.1f} -> "
              f"{statistics.median(per['ours_server']):.1f} us/task, "
              f"ours/baseline {statistics.median(server):.3f} "
              f"(rounds {', '.join(f'{r:.2f}' for r in server)}); Redis commands per task "
              f"{statistics.median(per['baseline_commands']):.2f} -> "
              f"{statistics.median(per['ours_commands']):.2f}", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k and 100k tasks, 3 rounds")
    ap.add_argument("--baseline-rev", default="HEAD", help="git revision without the Lua additions")
    ap.add_argument("--redis-server", metavar="PATH")
    ap.add_argument("--json", metavar="FILE", help="also write every figure to FILE")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(HERE))
    from queue_bench import default_redis_server

    from celery_ha.runtime.redis_process import RedisProcess, free_port

    sizes = [10_000, 100_000] if args.quick else [10_000, 1_000_000]
    rounds, n = (3, 5_000) if args.quick else (7, 20_000)
    with tempfile.TemporaryDirectory() as tmp:
        baseline = Path(tmp) / "baseline"
        baseline.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline_rev, "celery_ha"],
                                 capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive.stdout, check=True)
        server = RedisProcess(port=free_port(), data_dir=Path(tmp) / "redis",
                              binary=args.redis_server or default_redis_server())
        server.start()
        try:
            import redis
            version = redis.Redis(port=server.port).info("server")["redis_version"]
            print(f"redis-server {version}, baseline {args.baseline_rev}, python {sys.version.split()[0]}")
            print("scrape cost:")
            scrape = scrape_phase(server.port, sizes, 30)
            print(f"lifecycle ({n:,} tasks per run, {rounds} rounds, alternating):")
            life = lifecycle_phase(server.port, baseline, n, rounds)
        finally:
            server.stop()
    if args.json:
        doc = {"redis": version, "baseline": args.baseline_rev, "scrape": scrape, "lifecycle": life}
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
        child(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        sys.exit(0)
    sys.exit(main())
