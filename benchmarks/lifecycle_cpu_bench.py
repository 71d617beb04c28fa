"""Redis CPU and commands per durable lifecycle, this tree's scripts against another revision's, same run.

    python benchmarks/lifecycle_cpu_bench.py --baseline-rev 9820367          # 6,000 lifecycles each
    python benchmarks/lifecycle_cpu_bench.py --baseline-rev HEAD~3 --tasks 20000 --gated
    python benchmarks/lifecycle_cpu_bench.py --baseline-rev 9820367 --redis-server /usr/bin/redis-server

What a Celery worker's task costs Redis, without Celery: a window of 8 dispatched tasks, and per task
``claim`` (what the message's arrival does) then ``complete_and_dispatch`` with a refill of the window
(what the completion does), as the e2e bench's durable worker runs them. Two redis-servers, one per
side, fed in alternating batches of 200 lifecycles, so the machine's load (shared, noisy) falls on both
alike. Per lifecycle: the server's CPU (``/proc`` utime + stime), commands (``INFO commandstats``, the
scripts' inner commands included, by name) and the scripts' own time (``evalsha`` usec).

The baseline side runs ``git archive REV celery_ha``'s Lua through that revision's script loader
(``celery_ha/redisio/scripts.py``) and this tree's Python: for revisions whose script arguments are
this tree's (the point is a change of the Lua or its loader).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import celery_ha.redisio.scripts as scripts  # noqa: E402
import celery_ha.state.taskqueue as taskqueue  # noqa: E402
from celery_ha.runtime.redis_process import RedisProcess, free_port  # noqa: E402
from celery_ha.state import TaskQueue  # noqa: E402

BATCH = 200
WINDOW = 8


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def baseline_queue(client: redis.Redis, rev: str, dest: Path, gated: bool) -> TaskQueue:
    """A TaskQueue whose scripts are ``rev``'s, expanded by ``rev``'s own loader."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "celery_ha"], capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    spec = importlib.util.spec_from_file_location("baseline_scripts", dest / "celery_ha/redisio/scripts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    own_source, own_here, own_library = scripts.script_source, taskqueue._HERE, scripts.library_text
    scripts.script_source, taskqueue._HERE = module.script_source, dest / "celery_ha/state"
    # EVALSHA of rev's scripts: this tree's function library is built from this tree's Lua only.
    scripts.library_text = lambda *args: None
    try:
        return TaskQueue(client, "b", host_gate=gated)
    finally:
        scripts.script_source, taskqueue._HERE, scripts.library_text = own_source, own_here, own_library


class Side:
    def __init__(self, name: str, server: RedisProcess, queue: TaskQueue, client: redis.Redis) -> None:
        self.name, self.server, self.queue, self.client = name, server, queue, client
        self.todo: list[str] = []
        self.enqueued = 0
        self.done = 0
        self.cpu = 0.0
        self.calls: collections.Counter[str] = collections.Counter()
        self.usec: collections.Counter[str] = collections.Counter()

    def start(self, n: int) -> None:
        first, self.enqueued = self.enqueued, self.enqueued + n
        self.queue.enqueue_many([f"https://site-{i % 50}.example.com/p/{i}" for i in range(first, first + n)],
                                task="t")
        self.todo = [d.task_id for d in self.queue.dispatch(WINDOW)]

    def batch(self) -> None:
        self.client.config_resetstat()
        cpu0 = cpu_seconds(self.server.proc.pid)
        for _ in range(BATCH):
            if not self.todo:
                break
            lease = self.queue.claim(self.todo.pop(0), "bench@w")
            assert lease is not None
            _, more = self.queue.complete_and_dispatch(lease, window=WINDOW)
            self.todo.extend(d.task_id for d in more or [])
            self.done += 1
        self.cpu += cpu_seconds(self.server.proc.pid) - cpu0
        for key, stat in self.client.info("commandstats").items():
            name = key.removeprefix("cmdstat_")
            if name == "fcall":  # the scripts as functions of their library (Redis 7): counted as scripts
                name = "evalsha"
            if not name.startswith(("config", "info")):
                self.calls[name] += int(stat["calls"])
                self.usec[name] += int(stat["usec"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-rev", required=True, metavar="REV")
    parser.add_argument("--tasks", type=int, default=6000)
    parser.add_argument("--gated", action="store_true", help="both sides with the host gate on (50 hosts)")
    parser.add_argument("--redis-server", help="redis-server binary (default: the one tests use)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lifecycle-cpu-"))
    options = {"binary": args.redis_server} if args.redis_server else {}
    servers = [RedisProcess(port=free_port(), data_dir=tmp / f"redis{i}", **options).start()
               for i in range(2)]
    try:
        clients = [redis.Redis.from_url(s.url, decode_responses=True) for s in servers]
        base = baseline_queue(clients[1], args.baseline_rev, tmp / "baseline", args.gated)
        sides = [Side("this tree", servers[0], TaskQueue(clients[0], "b", host_gate=args.gated), clients[0]),
                 Side(f"baseline {args.baseline_rev}", servers[1], base, clients[1])]
        for side in sides:  # warm-up: scripts loaded, structures allocated
            side.start(500)
            while side.todo:
                side.batch()
            side.done, side.cpu = 0, 0.0
            side.calls.clear()
            side.usec.clear()
            side.start(args.tasks)
        while any(side.todo for side in sides):
            for side in sides:
                if side.todo:
                    side.batch()
        report(sides)
    finally:
        for s in servers:
            s.stop()


def report(sides: list[Side]) -> None:
    for side in sides:
        n = side.done
        inner = sum(v for k, v in side.calls.items() if k != "evalsha")
        print(f"{side.name:22} {n} lifecycles  Redis CPU {side.cpu * 1e6 / n:6.1f} us  commands "
              f"{sum(side.calls.values()) / n:5.2f} ({side.calls['evalsha'] / n:.2f} scripts + "
              f"{inner / n:.2f} inside)  script time {side.usec['evalsha'] / n:6.1f} us")
    names = sorted({k for side in sides for k in side.calls if k != "evalsha"})
    print("per lifecycle, by command: " + "  ".join(
        f"{k} " + "/".join(f"{side.calls[k] / side.done:.2f}" for side in sides) for k in names))


if __name__ == "__main__":
    main()
