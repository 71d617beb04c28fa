"""End to end through Celery: plain Celery tasks vs celery-ha durable tasks, side by side in one run.

Same Redis server (state in db 0, broker in db 1), same worker shape (``celery worker -P prefork -c N``,
acks_late, prefetch 1, JSON, task events on), rounds alternating plain / durable, medians.

    python benchmarks/e2e_bench.py                 # kinds noop and page, -c 2 4 8, 3 rounds (~6 min)
    python benchmarks/e2e_bench.py --quick         # -c 2 only, 1 round, fewer tasks (~1 min)
    python benchmarks/e2e_bench.py --concurrency 2 --tasks 3000 --rounds 5
    python benchmarks/e2e_bench.py --baseline-rev HEAD   # also durable tasks on another revision

``--baseline-rev REV`` adds a ``baseline`` system: durable tasks run by a worker on ``git archive REV``
(its ``celery_ha``, ``celeryconfig.py`` and ``tasks``, with this tree's ``benchmarks/e2e_durable.py``),
in the same rounds, so a change's before / after is two ratios to plain Celery from one run.
``--traced`` adds ``traced``: durable tasks with OpenTelemetry on — the SDK in the worker (spans
dropped by the exporter, ``benchmarks/e2e_tracing.py``) and every task enqueued under a span, so each
attempt is a span in its enqueuer's trace; ``durable`` in the same rounds is tracing off.
``--gated`` adds ``gated``: durable tasks with the host gate on (``CELERY_HA_HOSTS=1`` in the worker
and the pump, tasks enqueued gated; no limits, so every task waits in its host's queue and is handed
out by the gate): what the gate's bookkeeping costs end to end; with ``--baseline-rev`` also
``baseline-gated``, the same on that revision.
``--shards N`` adds ``sharded``: durable tasks in a namespace of N shards (``CELERY_HA_SHARDS`` in the
worker and the pump, on the one server): the refill is the pump's, across shards; with
``--baseline-rev`` also ``baseline-sharded``.
``--plain-reuse`` adds ``plain+reuse``: plain Celery whose kombu reuses its Redis clients as celery-ha's
worker does (``celery_ha/integration/patches/kombu_client_reuse.py``), so the durable layer's own cost shows
with that gain set aside. Every ratio is to ``plain``, plain Celery as it ships.

Kinds: ``noop`` (the task does nothing: the orchestration's own cost) and ``page`` (GET of a local
page, parse its title, store one item). A round times submission to the last completion: plain Celery
gets its N messages sent at once; durable tasks are enqueued in one call and pumped through the
window. Per task, from the server's INFO deltas over the round: ``reads`` (``total_reads_processed``:
one per request a client sent, a pipeline being one, so round trips) and ``commands``
(``total_commands_processed``: commands inside Lua scripts included). The plain tasks add one INCR each
so the bench can see them finish; the bench reads that counter with one GET every 10 ms, and the
durable layer's own ``completed`` counter with one HGET (``stats()``, two round trips and eight
commands a poll, took ~7 % of a core from the machine being measured). And CPU ms per task
of each role (``/proc`` utime + stime over the round): the worker's main process, its pool processes,
the Redis server, the bench itself (sending plain Celery's messages, enqueueing and pumping durable ones).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celery_ha.base.procfs import child_pids  # noqa: E402
from celery_ha.integration.patches import kombu_client_reuse  # noqa: E402
from celery_ha.runtime.redis_process import RedisProcess, free_port  # noqa: E402
from celery_ha.state import TaskQueue  # noqa: E402
from celery_ha.state.shards import shard_keys  # noqa: E402

CELERY = str(Path(sys.executable).parent / "celery")
NS = "e2e"
PAGE = b"<html><head><title>bench page</title></head><body>" + b"<p>text</p>" * 200 + b"</body></html>"


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *_: Any) -> None:
        pass


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (0 when it is gone), from ``/proc/PID/stat``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_site() -> tuple[http.server.ThreadingHTTPServer, str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class Bench:
    def __init__(self, redis_url: str, site: str, tmp: Path) -> None:
        base = redis_url.rsplit("/", 1)[0]
        self.state_url, self.broker_url = f"{base}/0", f"{base}/1"
        self.site = site
        self.tmp = tmp
        self.r = redis.Redis.from_url(self.state_url, decode_responses=True)
        self.batch = 1
        self.shards = 1  # of the sharded systems (--shards)
        self.redis_pid = 0  # the server's pid, for its CPU per task
        self.worker_pid = 0  # the running worker's main process (its pool: the rest of its group)
        self.roots: dict[str, Path] = {}  # system -> the source tree its worker runs (default ROOT)
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCH_STATE_URL": self.state_url,
                    "BENCH_BROKER_URL": self.broker_url, "CELERY_HA_REDIS_URL": self.state_url,
                    "CELERY_BROKER_URL": self.broker_url, "CELERY_HA_NAMESPACE": NS,
                    "CELERY_HA_EXTRA_IMPORTS": "benchmarks.e2e_durable", "CELERY_HA_OBEY_ROBOTS": "0"}

    # ------------------------------------------------------------------ workers
    def worker(self, system: str, concurrency: int) -> subprocess.Popen[bytes]:
        app = "benchmarks.e2e_plain" if system in PLAIN else "celery_ha"
        log = open(self.tmp / f"{system}-{concurrency}.log", "ab")
        env = {**self.env, "CELERY_HA_BATCH": str(self.batch)} if system in BATCHED else self.env
        env = {**env, "BENCH_PLAIN_REUSE": "1"} if system == "plain+reuse" else env
        if system == "traced":
            env = {**env, "CELERY_HA_EXTRA_IMPORTS": "benchmarks.e2e_durable,benchmarks.e2e_tracing"}
        if system in GATED:
            env = {**env, "CELERY_HA_HOSTS": "1"}
        if system in SHARDED:
            env = {**env, "CELERY_HA_SHARDS": str(self.shards)}
        root = self.roots.get(system, ROOT)
        env = {**env, "PYTHONPATH": str(root)}
        proc = subprocess.Popen([CELERY, "-A", app, "worker", "-P", "prefork", "-c", str(concurrency),
                                 "-n", f"{system}@bench", "--without-gossip", "--without-mingle",
                                 "--without-heartbeat", "-l", "warning"],
                                cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self._wait_ready(system, concurrency, proc)
        self.worker_pid = proc.pid
        return proc

    def _wait_ready(self, system: str, concurrency: int, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 60
        probe = self.r
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{system} worker exited (see {self.tmp})")
            if system not in PLAIN:  # durable, batch, baseline
                if int(probe.zcard(f"cha:{{{NS}}}:workers")) >= concurrency:
                    return
            else:
                out = subprocess.run([CELERY, "-A", "benchmarks.e2e_plain", "inspect", "ping", "-t", "1"],
                                     cwd=ROOT, env=self.env, capture_output=True, text=True)
                if "pong" in out.stdout:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{system} worker not ready after 60 s")

    @staticmethod
    def stop(proc: subprocess.Popen[bytes]) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    # ------------------------------------------------------------------ rounds
    def _info(self) -> tuple[int, int]:
        stats = self.r.info("stats")
        return int(stats["total_reads_processed"]), int(stats["total_commands_processed"])

    def _cpu(self) -> dict[str, float]:
        """CPU seconds so far of each role: the worker's main process, its pool, Redis, this bench."""
        pool = child_pids(self.worker_pid)
        own = os.times()
        return {"main": cpu_seconds(self.worker_pid), "pool": sum(cpu_seconds(p) for p in pool),
                "redis": cpu_seconds(self.redis_pid), "bench": own.user + own.system}

    def _reset(self) -> None:
        for db_url in (self.state_url, self.broker_url):
            client = redis.Redis.from_url(db_url)
            for key in client.scan_iter(count=1000):
                if not key.startswith(b"cha:{" + NS.encode() + b"}:workers") and \
                        not key.startswith(b"cha:{" + NS.encode() + b"}:tasknames"):
                    client.unlink(key)
            client.close()

    def round(self, system: str, kind: str, n: int) -> dict[str, float]:
        self._reset()
        urls = [f"{self.site}/p/{i}" for i in range(n)]
        reads0, cmds0 = self._info()
        cpu0 = self._cpu()
        started = time.perf_counter()
        if system in PLAIN:
            from benchmarks.e2e_plain import app

            name = "plain_noop" if kind == "noop" else "plain_page"
            with app.producer_or_acquire() as producer:
                for i, url in enumerate(urls):
                    app.send_task(name, args=[i if kind == "noop" else url], producer=producer)
            self._wait(lambda: int(self.r.get("plain:done") or 0) >= n)
        else:
            from celery_ha.base.settings import Settings
            from celery_ha.celery_app import app
            from celery_ha.integration.dispatch.pump import pump

            q = TaskQueue(self.r, NS, host_gate=system in GATED,
                          shards=self.shards if system in SHARDED else 1)
            name = "bench_noop" if kind == "noop" else "bench_page"
            if system == "traced":  # queued under a span: every task carries its trace context
                from benchmarks.e2e_tracing import provider

                with provider().get_tracer("bench").start_as_current_span("enqueue"):
                    q.enqueue_many(urls, task=name)
            else:
                q.enqueue_many(urls, task=name)
            env = {k: v for k, v in self.env.items() if k.startswith("CELERY")}
            if system in BATCHED:
                env["CELERY_HA_BATCH"] = str(self.batch)
            if system in GATED:
                env["CELERY_HA_HOSTS"] = "1"
            if system in SHARDED:
                env["CELERY_HA_SHARDS"] = str(self.shards)
            pump(q, app, Settings.from_env(env))
            # One HGET a poll, as plain's one GET (one per shard, pipelined, in a sharded namespace).
            counters = [k.stats for k in shard_keys(NS, self.shards if system in SHARDED else 1)]

            def completed() -> int:
                pipe = self.r.pipeline(transaction=False)
                for key in counters:
                    pipe.hget(key, "completed")
                return sum(int(v or 0) for v in pipe.execute())

            self._wait(lambda: completed() >= n)
        elapsed = time.perf_counter() - started
        reads1, cmds1 = self._info()
        cpu1 = self._cpu()
        return {"seconds": elapsed, "rate": n / elapsed, "reads_per_task": (reads1 - reads0) / n,
                "commands_per_task": (cmds1 - cmds0) / n,
                **{f"cpu_ms_{role}": (cpu1[role] - cpu0[role]) * 1000 / n for role in cpu0}}

    @staticmethod
    def _wait(done: Any, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError("round did not finish in time")
            time.sleep(0.01)


PLAIN = ("plain", "plain+reuse")  # plain Celery workers; the second with celery-ha's kombu client reuse
BATCHED = ("batch", "baseline-batch")  # durable systems run with CELERY_HA_BATCH=--batch
GATED = ("gated", "baseline-gated")  # durable systems run with the host gate on (--gated)
SHARDED = ("sharded", "baseline-sharded")  # durable systems in a namespace of --shards shards
CPU_FIELDS = ("cpu_ms_main", "cpu_ms_pool", "cpu_ms_redis", "cpu_ms_bench")


def cpu_line(row: dict[str, Any], system: str) -> str:
    """CPU ms per task of each role for ``system``, e.g. ``main 0.52 pool 1.10 redis 0.41 bench 0.05``."""
    return " ".join(f"{f.removeprefix('cpu_ms_')} {row[f'{system}_{f}']:.2f}" for f in CPU_FIELDS)


def baseline_tree(rev: str, dest: Path) -> Path:
    """``git archive rev`` of what a worker runs, unpacked in ``dest``, plus this tree's bench tasks."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "celery_ha", "celeryconfig.py",
                              "tasks"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    (dest / "benchmarks").mkdir()
    shutil.copy(ROOT / "benchmarks" / "e2e_durable.py", dest / "benchmarks" / "e2e_durable.py")
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--concurrency", type=int, nargs="+")
    parser.add_argument("--kinds", nargs="+", default=["noop", "page"], choices=["noop", "page"])
    parser.add_argument("--tasks", type=int)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--redis-server", help="redis-server binary (default: the one tests use)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--batch", type=int, default=0,
                        help="also run durable tasks with CELERY_HA_BATCH=N (the 'batch' columns)")
    parser.add_argument("--baseline-rev", metavar="REV",
                        help="also run durable tasks on this git revision (the 'baseline' columns; with "
                             "--batch also batched there: 'baseline-batch')")
    parser.add_argument("--traced", action="store_true",
                        help="also run durable tasks with OpenTelemetry on (the 'traced' rows)")
    parser.add_argument("--gated", action="store_true",
                        help="also run durable tasks with the host gate on (the 'gated' rows)")
    parser.add_argument("--shards", type=int, default=0,
                        help="also run durable tasks in a namespace of N shards (the 'sharded' rows)")
    parser.add_argument("--plain-reuse", action="store_true",
                        help="also run plain Celery with celery-ha's kombu client reuse (the "
                             "'plain+reuse' rows: what the durable layer costs with that gain set aside)")
    args = parser.parse_args()
    # This process sends plain Celery's messages and pumps the durable ones: one kombu for both, the
    # one celery-ha's app installs when it is imported.
    kombu_client_reuse.install()
    concurrencies = args.concurrency or ([2] if args.quick else [2, 4, 8])
    rounds = args.rounds or (1 if args.quick else 3)
    n = args.tasks or (500 if args.quick else 2000)

    tmp = Path(tempfile.mkdtemp(prefix="e2e-bench-"))
    options = {"binary": args.redis_server} if args.redis_server else {}
    server = RedisProcess(port=free_port(), data_dir=tmp / "redis", **options).start()
    site, site_url = start_site()
    bench = Bench(server.url, site_url, tmp)
    bench.redis_pid = server.proc.pid if server.proc else 0
    bench.batch = max(1, args.batch)
    systems: tuple[str, ...] = ("plain", "durable", "batch") if args.batch > 1 else ("plain", "durable")
    if args.plain_reuse:
        systems += ("plain+reuse",)
    if args.traced:
        systems += ("traced",)
    if args.gated:
        systems += ("gated",)
    bench.shards = max(1, args.shards)
    if args.shards > 1:
        systems += ("sharded",)
    if args.baseline_rev:
        bench.roots["baseline"] = baseline_tree(args.baseline_rev, tmp / "baseline")
        systems += ("baseline",)
        if args.batch > 1:  # the same batches on the baseline's code
            bench.roots["baseline-batch"] = bench.roots["baseline"]
            systems += ("baseline-batch",)
        if args.gated:  # the gate on the baseline's code
            bench.roots["baseline-gated"] = bench.roots["baseline"]
            systems += ("baseline-gated",)
        if args.shards > 1:  # the shards on the baseline's code
            bench.roots["baseline-sharded"] = bench.roots["baseline"]
            systems += ("baseline-sharded",)
    os.environ.update({k: v for k, v in bench.env.items() if k.startswith(("BENCH_", "CELERY"))})
    results: list[dict[str, Any]] = []
    try:
        for kind in args.kinds:
            for c in concurrencies:
                measured: dict[str, list[dict[str, float]]] = {system: [] for system in systems}
                for _ in range(rounds):
                    for system in systems:
                        bench._reset()  # the namespace's recorded shard count goes too (--shards)
                        proc = bench.worker(system, c)
                        try:
                            bench.round(system, kind, max(50, n // 10))  # warm-up
                            measured[system].append(bench.round(system, kind, n))
                        finally:
                            bench.stop(proc)
                            bench.r.unlink(f"cha:{{{NS}}}:workers")  # the next worker starts counted afresh
                row: dict[str, Any] = {"kind": kind, "concurrency": c, "tasks": n, "rounds": rounds}
                for system, runs in measured.items():
                    for field in ("rate", "reads_per_task", "commands_per_task", *CPU_FIELDS):
                        row[f"{system}_{field}"] = statistics.median(r[field] for r in runs)
                    row[f"{system}_rates"] = [round(r["rate"], 1) for r in runs]  # each round's, in order
                for system in systems[1:]:
                    ratios = [m["rate"] / p["rate"] for p, m in zip(measured["plain"], measured[system],
                                                                     strict=True)]
                    prefix = "" if system == "durable" else f"{system}_"
                    row[f"{prefix}ratio"] = statistics.median(ratios)
                    row[f"{prefix}ratio_range"] = (min(ratios), max(ratios))
                results.append(row)
                for system in systems:
                    prefix = "" if system == "durable" else f"{system}_"
                    ratio = "" if system == "plain" else (
                        f"  x{row[f'{prefix}ratio']:.2f} ({row[f'{prefix}ratio_range'][0]:.2f}-"
                        f"{row[f'{prefix}ratio_range'][1]:.2f})")
                    print(f"{kind:5} -c {c} {system:11} {row[f'{system}_rate']:7.0f}/s{ratio:20}"
                          f"  reads/task {row[f'{system}_reads_per_task']:4.1f}"
                          f"  commands/task {row[f'{system}_commands_per_task']:5.1f}"
                          f"  CPU ms/task {cpu_line(row, system)}", flush=True)
    finally:
        site.shutdown()
        server.stop()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
