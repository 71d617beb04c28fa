"""A million-URL backlog: queueing it through the CLI, what it costs Redis, and whether the crawl and the
operator commands still behave as on a small one.

One redis-server of its own (state db 0, broker db 1, no persistence), the demo site in this process
(the URLs are its case pages), and:

1. ``celery-ha enqueue -f FILE`` of ``--urls`` URLs (default 1,000,000) in a child process, exactly as
   an operator runs it: wall time, tasks/s, the child's peak RSS, and Redis ``used_memory`` per
   queued task (``INFO memory`` before and after, same server).
2. One ``celery -A celery_ha worker -c --concurrency`` is started on that backlog: seconds from its
   launch to its registration and to the first completed task, completions per second while it
   crawls for ``--crawl-seconds``, and the broker's length (sum of the LLENs of the namespace's
   crawl queue, every priority list, sampled every 20 ms; plus kombu's ``unacked`` hash: messages
   delivered, not yet acked) against the window (2 × live concurrency).
3. With the worker stopped, ``--dead`` tasks are failed without retry (dead letters) and
   ``--items`` tasks commit one item each (the export), through the task-layer API.
4. ``celery-ha stats``, ``stats --json``, ``dead list``, ``tasks --state queued --limit 50`` and
   ``export -o FILE`` are each run ``--repeat`` times (median) on the backlog and on an empty
   namespace of the same server; beside the wall time (mostly Python start-up on a shared machine),
   the Redis commands each call made and the bytes Redis sent it (``INFO stats`` deltas): counts that
   do not depend on the machine's speed, and that would grow with the backlog if a command walked it.

    python benchmarks/backlog_bench.py                 # 1,000,000 URLs, ~3 min
    python benchmarks/backlog_bench.py --urls 100000 --json /tmp/backlog.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celery_ha.demo.site import DemoSite  # noqa: E402
from celery_ha.integration.core.queues import broker_queue  # noqa: E402
from celery_ha.integration.dispatch.broker import broker_backlog  # noqa: E402
from celery_ha.runtime.redis_process import RedisProcess, free_port  # noqa: E402
from celery_ha.state import TaskQueue  # noqa: E402

BIN = Path(sys.executable).parent
NS, EMPTY_NS = "backlog", "empty"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Bench:
    def __init__(self, server: RedisProcess, tmp: Path, args: Any) -> None:
        base = server.url.rsplit("/", 1)[0]
        self.state_url, self.broker_url = f"{base}/0", f"{base}/1"
        self.tmp, self.args = tmp, args
        self.r = redis.Redis.from_url(self.state_url, decode_responses=True)
        self.broker = redis.Redis.from_url(self.broker_url, decode_responses=True)
        self.q = TaskQueue(self.r, NS)
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "CELERY_HA_REDIS_URL": self.state_url,
                    "CELERY_BROKER_URL": self.broker_url, "CELERY_HA_NAMESPACE": NS,
                    "PYTHONUNBUFFERED": "1"}
        self.out: dict[str, Any] = {"urls": args.urls, "load_start": load()}

    def cli(self, *argv: str, namespace: str = NS, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        env = {**self.env, "CELERY_HA_NAMESPACE": namespace}
        return subprocess.run([str(BIN / "celery-ha"), *argv], env=env, capture_output=True, check=check)

    def counters(self) -> tuple[int, int]:
        stats = self.r.info("stats")
        return int(stats["total_commands_processed"]), int(stats["total_net_output_bytes"])

    # ------------------------------------------------------------------ 1. enqueue
    def enqueue(self, site: DemoSite) -> None:
        listing = self.tmp / "urls.txt"
        with listing.open("w") as f:
            for i in range(self.args.urls):
                f.write(f"{site.case_url(i)}\n")
        self.r.flushall()
        mem0 = int(self.r.info("memory")["used_memory"])
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        started = time.perf_counter()
        done = self.cli("enqueue", "-f", str(listing), "--json")
        elapsed = time.perf_counter() - started
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        mem1 = int(self.r.info("memory")["used_memory"])
        result = json.loads(done.stdout)
        queued = self.q.stats()["queued"]
        self.out["enqueue"] = {
            "seconds": elapsed, "tasks_per_s": self.args.urls / elapsed, "new": result["new"],
            "queued": queued, "used_memory_delta": mem1 - mem0, "bytes_per_task": (mem1 - mem0) / queued,
            "cli_peak_rss_mib": max(rss, before) / 1024, "stderr": done.stderr.decode()[-200:],
            "load": load()}
        print(f"enqueue: {elapsed:.1f}s, {self.args.urls / elapsed:,.0f} tasks/s, "
              f"{(mem1 - mem0) / queued:.0f} B/task, CLI peak RSS {max(rss, before) / 1024:.0f} MiB "
              f"(load {load()})", flush=True)

    # ------------------------------------------------------------------ 2. a worker on the backlog
    def crawl(self) -> None:
        log = open(self.tmp / "worker.log", "ab")
        c = self.args.concurrency
        crawl_queue = broker_queue(NS)
        started = time.perf_counter()
        proc = subprocess.Popen(
            [str(BIN / "celery"), "-A", "celery_ha", "worker", "-P", "prefork", "-c", str(c), "-n",
             "backlog@bench", "--without-gossip", "--without-mingle", "-l", "warning"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        registered = first = None
        max_len = max_unacked = samples = 0
        lengths: list[int] = []
        deadline = None
        try:
            while True:
                now = time.perf_counter()
                if proc.poll() is not None:
                    raise RuntimeError(f"the worker exited (log {self.tmp / 'worker.log'})")
                if registered is None and int(self.r.zcard(f"cha:{{{NS}}}:workers")) >= c:
                    registered = now - started
                if first is None and int(self.q.stats()["completed"]) >= 1:
                    first = now - started
                    done0, t0 = 0, now
                    deadline = now + self.args.crawl_seconds
                backlog = broker_backlog(self.broker, crawl_queue)
                unacked = int(self.broker.hlen("unacked"))
                max_len, max_unacked = max(max_len, backlog), max(max_unacked, unacked)
                lengths.append(backlog)
                samples += 1
                if deadline is not None and now >= deadline:
                    break
                if now - started > 180:
                    raise RuntimeError("no task completed within 180 s")
                time.sleep(0.02)
            done = int(self.q.stats()["completed"]) - done0
            rate = done / (time.perf_counter() - t0)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        window = 2 * c
        self.out["crawl"] = {
            "concurrency": c, "window": window, "registered_s": registered, "first_completed_s": first,
            "completed_per_s": rate, "broker_len_max": max_len,
            "broker_len_median": statistics.median(lengths),
            "unacked_max": max_unacked, "samples": samples, "load": load()}
        print(f"crawl: registered after {registered:.1f}s, first task completed after {first:.1f}s, "
              f"{rate:.0f} tasks/s; broker length max {max_len} (window {window}), unacked max "
              f"{max_unacked}, {samples} samples (load {load()})", flush=True)

    # ------------------------------------------------------------------ 3. dead letters and items
    def dead_and_items(self) -> None:
        self.q.reclaim_expired()
        for _ in range(self.args.dead):
            lease = self.q.claim_next(worker="bench")
            assert lease is not None
            self.q.fail(lease, "bench: an injected permanent failure", retry=False)
        for i in range(self.args.items):
            lease = self.q.claim_next(worker="bench")
            assert lease is not None
            self.q.commit(lease, [(f"bench-{i}", {"url": lease.url, "title": f"item {i}", "n": i})])
            self.q.complete(lease)
        stats = self.q.stats()
        self.out["state"] = {k: stats[k] for k in ("queued", "dispatched", "running", "delayed", "completed",
                                                   "dead", "items")}
        print(f"state: {self.out['state']}", flush=True)

    # ------------------------------------------------------------------ 4. operator commands
    def commands(self) -> None:
        export = self.tmp / "export.jsonl"
        calls = {
            "stats": ["stats"],
            "stats --json": ["stats", "--json"],
            "dead list": ["dead", "list"],
            "tasks --state queued --limit 50": ["tasks", "--state", "queued", "--limit", "50"],
            "export -o FILE": ["export", "-o", str(export)],
        }
        rows = []
        for label, argv in calls.items():
            row: dict[str, Any] = {"command": f"celery-ha {' '.join(argv).replace(str(export), 'FILE')}"}
            for ns, tag in ((NS, "backlog"), (EMPTY_NS, "empty")):
                times, cmds, sent = [], [], []
                for _ in range(self.args.repeat):
                    c0, b0 = self.counters()
                    t0 = time.perf_counter()
                    self.cli(*argv, namespace=ns)
                    times.append(time.perf_counter() - t0)
                    c1, b1 = self.counters()
                    cmds.append(c1 - c0 - 1)  # the INFO of the first reading
                    sent.append(b1 - b0)
                row[f"{tag}_s"] = statistics.median(times)
                row[f"{tag}_commands"] = statistics.median(cmds)
                row[f"{tag}_bytes"] = statistics.median(sent)
                if label.startswith("export") and ns == NS:  # before the empty namespace's run replaces it
                    row["lines"] = sum(1 for _ in export.open())
            rows.append(row)
            print(f"{row['command']:45} backlog {row['backlog_s'] * 1000:6.0f} ms, "
                  f"{row['backlog_commands']:5.0f} commands, {row['backlog_bytes']:9.0f} B | "
                  f"empty {row['empty_s'] * 1000:6.0f} ms, "
                  f"{row['empty_commands']:5.0f} commands, {row['empty_bytes']:9.0f} B", flush=True)
        self.out["commands"] = rows
        self.out["load_end"] = load()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--urls", type=int, default=1_000_000, help="URLs queued")
    parser.add_argument("--concurrency", type=int, default=4, help="-c of the worker")
    parser.add_argument("--crawl-seconds", type=float, default=20.0,
                        help="how long the worker crawls after its first completed task")
    parser.add_argument("--dead", type=int, default=500, help="tasks failed into dead letters")
    parser.add_argument("--items", type=int, default=3000, help="items committed for the export")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each operator command (median)")
    parser.add_argument("--redis-server", help="redis-server binary (default: the one the tests use)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="backlog-bench-"))
    options = {"binary": args.redis_server} if args.redis_server else {}
    server = RedisProcess(port=free_port(), data_dir=tmp / "redis", **options).start()
    site = DemoSite(total=args.urls, page_size=20).start()
    bench = Bench(server, tmp, args)
    print(f"redis-server {server.binary}; load average {load()}", flush=True)
    try:
        bench.enqueue(site)
        bench.crawl()
        bench.dead_and_items()
        bench.commands()
    finally:
        site.stop()
        server.stop()
    if args.json:
        args.json.write_text(json.dumps(bench.out, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
