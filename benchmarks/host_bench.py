"""Host gate benchmark: what host-aware dispatch and claim cost, at 10, 1,000 and 100,000 hosts, against
the ungated queue in the same run; and the fairness figure (a small host behind a rate-limited one).

    python benchmarks/host_bench.py                 # full run (a few minutes on 2 cores)
    python benchmarks/host_bench.py --quick         # 10 and 1,000 hosts only, fewer claims
    python benchmarks/host_bench.py --json out.json
    python benchmarks/host_bench.py --baseline-src /tmp/base   # + the gate-off hot path vs that tree

``--baseline-src``: a source tree of the code before the host gate (``git archive <commit> | tar -x -C
DIR``); the ungated hot path (enqueue_many, claim_next + complete) is timed with it and with this tree,
alternating, each in a subprocess of its own against the same Redis.

Everything runs against one freshly started redis-server (no persistence), FLUSHALL between phases.

* claim cost: ``claim_next`` + ``complete`` (standalone mode, 2 round trips) per task, median of rounds,
  µs per task; and the commands the server ran per claim (``total_commands_processed`` delta, which
  counts the commands inside Lua). The baseline is the same queue with the gate off (every task in its
  priority band), same tasks, same run.
* dispatch cost: ``dispatch(window)`` of 1,000 tasks at a time (ready -> dispatched), µs per task.
* hosts: H hosts with ``max(2, 40,000 / H)`` tasks each, enqueued host by host; no limits, so every
  host is eligible (the hand-out path with the most work: pop, re-file the host in hready).
* fairness: 4 threads claim, "work" 5 ms and complete; host A (600 tasks, rate 50/s) is queued before
  host B (40 tasks, no limit). B's time to finish alone vs behind A, with the gate on; and behind A
  with the gate off (today's FIFO, A unpaced).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from celery_ha.runtime.redis_process import RedisProcess, free_port  # noqa: E402
from celery_ha.state import TaskQueue  # noqa: E402


def specs(hosts: int, total: int) -> list[str]:
    per = max(2, total // hosts)
    return [f"http://h{h}.example/p/{i}" for h in range(hosts) for i in range(per)]


def commands(r: redis.Redis) -> int:
    return int(r.info("stats")["total_commands_processed"])


def claim_round(url: str, gate: bool, urls: list[str], claims: int) -> tuple[float, float]:
    """µs per claim_next + complete, and server commands per claim, on a fresh namespace."""
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushall()
    q = TaskQueue.from_url(url, "hb", host_gate=gate, lease_ttl=600)
    for start in range(0, len(urls), 5000):
        q.enqueue_many(urls[start:start + 5000], batch_size=5000)
    before = commands(r)
    t0 = time.perf_counter()
    done = 0
    lease = q.claim_next("w")
    while lease is not None and done < claims:
        q.complete(lease)
        done += 1
        lease = q.claim_next("w")
    elapsed = time.perf_counter() - t0
    cmds = (commands(r) - before - 2 * done) / max(1, done)  # minus the two EVALSHA themselves
    return elapsed / max(1, done) * 1e6, cmds


def dispatch_round(url: str, gate: bool, urls: list[str], rounds: int) -> float:
    """µs per task of dispatch(1000) (the inflight set emptied between calls by a raw ZREM of
    nothing: each call moves 1,000 fresh tasks, the window is raised instead)."""
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushall()
    q = TaskQueue.from_url(url, "hb", host_gate=gate, lease_ttl=600)
    for start in range(0, len(urls), 5000):
        q.enqueue_many(urls[start:start + 5000], batch_size=5000)
    t0 = time.perf_counter()
    moved = 0
    for i in range(rounds):
        moved += len(q.dispatch(1000 * (i + 1), redispatch_after=86_400))
    return (time.perf_counter() - t0) / max(1, moved) * 1e6


def fairness(url: str, gate: bool, behind: bool) -> float:
    """Seconds until host B's 40 tasks are all complete (4 claiming threads, 5 ms of work each)."""
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushall()
    q = TaskQueue.from_url(url, "fair", host_gate=gate, lease_ttl=600)
    if gate:
        q.hosts.set("a.example", rate="50/1")
    if behind:
        q.enqueue_many([f"http://a.example/p/{i}" for i in range(600)])
    b_ids = set(q.enqueue_many([f"http://b.example/p/{i}" for i in range(40)]))
    left = set(b_ids)
    lock = threading.Lock()
    start = time.perf_counter()
    finished: list[float] = []
    stop = threading.Event()

    def work() -> None:
        mine = TaskQueue.from_url(url, "fair", host_gate=gate, lease_ttl=600)
        while not stop.is_set():
            lease = mine.claim_next("w", wait=0.05)
            if lease is None:
                continue
            time.sleep(0.005)
            mine.complete(lease)
            with lock:
                left.discard(lease.task_id)
                if not left and not finished:
                    finished.append(time.perf_counter() - start)
                    stop.set()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    stop.wait(300)
    stop.set()
    for t in threads:
        t.join()
    return finished[0] if finished else float("inf")


HOT_PATH = """
import sys, time, statistics
import redis
from celery_ha.state import TaskQueue
url = sys.argv[1]
r = redis.Redis.from_url(url)
urls = [f"https://example.com/case/{i}" for i in range(20000)]
r.flushall()
q = TaskQueue.from_url(url, "hot", lease_ttl=600)
t0 = time.perf_counter()
q.enqueue_many(urls)
enq = len(urls) / (time.perf_counter() - t0)
t0 = time.perf_counter()
n = 0
lease = q.claim_next("w")
while lease is not None and n < 3000:
    lease = q.complete_and_claim(lease)
    n += 1
life = n / (time.perf_counter() - t0)
print(enq, life)
"""


def hot_path(url: str, src: str) -> tuple[float, float]:
    """(enqueue_many tasks/s, complete_and_claim tasks/s) of the ungated queue of source tree ``src``."""
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-c", HOT_PATH, url], env=env, cwd=src, capture_output=True,
                         text=True, check=True).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--baseline-src", help="source tree of the code before the host gate")
    parser.add_argument("--skip-hosts", action="store_true", help="only the gate-off hot path")
    args = parser.parse_args()
    server = RedisProcess(port=free_port(), data_dir=Path("/tmp") / f"host-bench-{free_port()}").start()
    url = server.url
    out: dict[str, Any] = {"hosts": {}}
    try:
        if args.baseline_src:
            base, ours = [], []
            for _ in range(3 if args.quick else 5):
                base.append(hot_path(url, args.baseline_src))
                ours.append(hot_path(url, str(ROOT)))
            enq = statistics.median(o[0] for o in ours) / statistics.median(b[0] for b in base)
            life = statistics.median(o[1] for o in ours) / statistics.median(b[1] for b in base)
            out["gate_off"] = {"baseline": base, "ours": ours, "enqueue_ratio": enq, "lifecycle_ratio": life}
            print(f"gate off, this tree / baseline (medians): enqueue_many {enq:.3f}x, "
                  f"complete_and_claim {life:.3f}x; rounds (enqueue/s, lifecycle/s): base "
                  f"{[(round(a), round(b)) for a, b in base]}, "
                  f"ours {[(round(a), round(b)) for a, b in ours]}", flush=True)
        sizes = () if args.skip_hosts else (10, 1000) if args.quick else (10, 1000, 100_000)
        claims = 2000 if args.quick else 5000
        rounds = 3
        for hosts in sizes:
            urls = specs(hosts, 40_000)
            row: dict[str, Any] = {"tasks": len(urls)}
            for gate in (False, True):
                name = "gated" if gate else "plain"
                runs = [claim_round(url, gate, urls, claims) for _ in range(rounds)]
                row[f"claim_us_{name}"] = statistics.median(x for x, _ in runs)
                row[f"claim_cmds_{name}"] = statistics.median(c for _, c in runs)
                row[f"dispatch_us_{name}"] = statistics.median(
                    dispatch_round(url, gate, urls, 5) for _ in range(rounds))
            row["claim_ratio"] = row["claim_us_gated"] / row["claim_us_plain"]
            row["dispatch_ratio"] = row["dispatch_us_gated"] / row["dispatch_us_plain"]
            out["hosts"][hosts] = row
            print(f"{hosts:>7} hosts ({row['tasks']} tasks): claim+complete {row['claim_us_plain']:.0f} µs "
                  f"plain / {row['claim_us_gated']:.0f} µs gated ({row['claim_ratio']:.2f}x), server "
                  f"commands per claim {row['claim_cmds_plain']:.1f} / {row['claim_cmds_gated']:.1f}; "
                  f"dispatch {row['dispatch_us_plain']:.1f} / {row['dispatch_us_gated']:.1f} µs per task "
                  f"({row['dispatch_ratio']:.2f}x)", flush=True)
        if not args.skip_hosts:
            alone = fairness(url, True, False)
            behind = fairness(url, True, True)
            fifo = fairness(url, False, True)
            out["fairness"] = {"b_alone_s": alone, "b_behind_a_gated_s": behind, "b_behind_a_ungated_s": fifo,
                               "ratio_gated": behind / alone, "ratio_ungated": fifo / alone}
            print(f"fairness: B alone {alone:.2f} s, behind rate-limited A with the gate {behind:.2f} s "
                  f"({behind / alone:.2f}x), behind A without the gate (FIFO) {fifo:.2f} s "
                  f"({fifo / alone:.2f}x)")
    finally:
        server.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
