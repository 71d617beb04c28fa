"""Where a durable task's Redis CPU goes (issue 30 item 3): by command, and inside the scripts.

Two measurements, each on a redis-server of its own (free loopback port):

``commandstats`` runs one warm-up round and one measured round of N tasks through a real worker, for
each system named (``plain`` Celery and/or ``durable``; the classes of ``e2e_bench.py``), and prints
``INFO commandstats`` of the measured round per task: calls and µs of each command, the scripts'
``EVALSHA`` with their inner commands counted apart. So the gap to plain Celery shows as commands or
as the scripts' own Lua. ``--by-script`` also logs every command of the measured round in the slow
log (threshold 0; the log's own cost falls on every command alike) and prints each script's calls
and µs per call, named by its SHA1.

``prelude`` times, with ``EVALSHA`` from one client, a script's prelude (its includes as loaded, up
to its own first statement, then ``return 0``), the same without its ``local function`` definitions
(what making the closures costs), and ``return 0`` alone: what every call of that script pays before
it does anything, which Redis 7 functions (a library loaded once) would not.

    python benchmarks/script_cost_bench.py commandstats --kind noop --tasks 2000 --concurrency 2 plain durable
    python benchmarks/script_cost_bench.py prelude claim complete_dispatch
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from celery_ha.redisio.functions import library_text  # noqa: E402
from celery_ha.redisio.scripts import script_source  # noqa: E402
from celery_ha.runtime.redis_process import RedisProcess, free_port  # noqa: E402
from celery_ha.state import TaskQueue  # noqa: E402
from celery_ha.state.taskqueue import ROW_SCRIPTS  # noqa: E402

STATE_LUA = ROOT / "celery_ha" / "state"


def _script_names() -> dict[str, str]:
    """SHA1 of every script of the library's folders, as loaded -> its name."""
    import hashlib

    names = {}
    for folder in sorted({p.parent for p in (ROOT / "celery_ha").rglob("*.lua")}):
        stems = tuple(sorted(p.stem for p in folder.glob("*.lua") if not p.stem.startswith("_")))
        for stem in stems:
            text = script_source(str(folder), stem)
            names[hashlib.sha1(text.encode("utf-8")).hexdigest()] = stem
        listed = tuple(s for s in stems if s not in ROW_SCRIPTS)  # as TaskQueue's ScriptSet lists them
        library = library_text(str(folder), "_common", listed)  # Redis 7: FCALL <function name>
        names.update({function: stem for stem, function in (library.functions if library else {}).items()})
    return names


def _by_script(r: redis.Redis, tasks: int) -> None:
    """Per script: calls per task and µs per call, from the slow log of the round."""
    names = _script_names()
    spent: dict[str, list[int]] = {}
    for entry in r.slowlog_get(r.slowlog_len()):
        words = entry["command"].split()
        if words and words[0].upper() in (b"EVALSHA", "EVALSHA", b"FCALL", "FCALL") and len(words) > 1:
            sha = words[1].decode() if isinstance(words[1], bytes) else words[1]
            spent.setdefault(names.get(sha, sha[:12]), []).append(int(entry["duration"]))
    for name, durations in sorted(spent.items(), key=lambda kv: -sum(kv[1])):
        durations.sort()
        print(f"  script {name:22s} calls/task {len(durations) / tasks:5.2f}  µs/call mean "
              f"{sum(durations) / len(durations):6.1f}  median {durations[len(durations) // 2]}")


def commandstats(binary: str, kind: str, tasks: int, concurrency: int, systems: list[str],
                 by_script: bool = False) -> None:
    from benchmarks.e2e_bench import Bench, start_site

    tmp = Path(tempfile.mkdtemp())
    server = RedisProcess(port=free_port(), data_dir=tmp / "redis", binary=binary).start()
    _site, site_url = start_site()
    bench = Bench(server.url, site_url, tmp)
    bench.redis_pid = server.proc.pid if server.proc else 0
    # The rounds send from this process: its Celery apps must use the bench's server, never a default.
    os.environ.update({k: v for k, v in bench.env.items() if k.startswith(("BENCH_", "CELERY"))})
    r = redis.Redis.from_url(server.url)
    try:
        for system in systems:
            proc = bench.worker(system, concurrency)
            try:
                bench.round(system, kind, tasks)  # warm-up
                r.config_resetstat()
                if by_script:
                    r.config_set("slowlog-max-len", 40 * tasks)
                    r.slowlog_reset()
                    r.config_set("slowlog-log-slower-than", 0)
                cpu0 = r.info("cpu")
                row = bench.round(system, kind, tasks)
                cpu1, traffic, clients = r.info("cpu"), r.info("stats"), r.info("clients")
                r.config_set("slowlog-log-slower-than", 10_000)
            finally:
                bench.stop(proc)
            stats = r.info("commandstats")
            total = sum(v["usec"] for v in stats.values())
            print(f"== {system} {kind} -c {concurrency}: Redis CPU {row['cpu_ms_redis']:.3f} ms per task, "
                  f"command time {total / tasks:.1f} µs per task", flush=True)
            # Outside the commands: the event loop's reads and writes (a read event is one read(2) and
            # the parse of what it brought), the bytes, and user against kernel CPU.
            user = (cpu1["used_cpu_user_main_thread"] - cpu0["used_cpu_user_main_thread"]) * 1e6 / tasks
            kernel = (cpu1["used_cpu_sys_main_thread"] - cpu0["used_cpu_sys_main_thread"]) * 1e6 / tasks
            print(f"  main thread µs/task: user {user:.1f}, kernel {kernel:.1f}; read events/task "
                  f"{traffic['total_reads_processed'] / tasks:.2f}, write events/task "
                  f"{traffic['total_writes_processed'] / tasks:.2f}; bytes in/task "
                  f"{traffic['total_net_input_bytes'] / tasks:.0f}, out/task "
                  f"{traffic['total_net_output_bytes'] / tasks:.0f}; clients {clients['connected_clients']}, "
                  f"blocked {clients['blocked_clients']}", flush=True)
            for name, v in sorted(stats.items(), key=lambda kv: -kv[1]["usec"])[:16]:
                print(f"  {name.removeprefix('cmdstat_'):20s} calls/task {v['calls'] / tasks:6.2f}  "
                      f"µs/task {v['usec'] / tasks:7.1f}  µs/call {v['usec_per_call']:.1f}")
            if by_script:
                _by_script(r, tasks)
                r.slowlog_reset()
    finally:
        server.stop()


def _prelude(name: str) -> str:
    """The script as loaded, cut before its own first top-level statement."""
    source = script_source(str(STATE_LUA), name)
    own = (STATE_LUA / f"{name}.lua").read_text(encoding="utf-8")
    first = next(line for line in own.split("\n")
                 if line and not line.startswith(("--", " ", "]]")))
    return source[:source.rindex(first)]


def prelude(binary: str, names: list[str], calls: int, rounds: int) -> None:
    server = RedisProcess(port=free_port(), binary=binary).start()
    try:
        r = redis.Redis(host=server.host, port=server.port, decode_responses=True)
        keys = TaskQueue(r, "p")._key_lists[0]
        prefix = keys[0][:keys[0].index("}") + 2]
        print(f"redis {r.info('server')['redis_version']}; µs per EVALSHA, {calls} calls, {rounds} rounds")
        for name in names:
            pre = _prelude(name)
            bare = re.sub(r"(?ms)^local function .*?^end\n", "", pre)  # multi-line definitions
            bare = re.sub(r"(?m)^local function .* end$", "", bare)  # one-line ones
            variants = {"return 0": "return 0", "prelude": pre + "return 0",
                        "prelude without its local functions": bare + "return 0"}
            for label, text in variants.items():
                sha = r.script_load(text)
                samples = []
                for _ in range(rounds):
                    r.config_resetstat()
                    for _ in range(calls):
                        r.evalsha(sha, len(keys), *keys, prefix, "x", "w", "30000")
                    samples.append(float(r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]))
                functions = len(re.findall(r"(?m)^local function", text))
                print(f"  {name:18s} {label:38s} {min(samples):6.2f} (rounds: "
                      f"{', '.join(f'{s:.2f}' for s in samples)}; {functions} functions)", flush=True)
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis-server", help="the redis-server binary (default: the one on PATH)")
    sub = ap.add_subparsers(dest="mode", required=True)
    cs = sub.add_parser("commandstats", help="INFO commandstats per task of a round through a real worker")
    cs.add_argument("systems", nargs="+", choices=("plain", "durable"))
    cs.add_argument("--kind", choices=("noop", "page"), default="noop")
    cs.add_argument("--tasks", type=int, default=2000)
    cs.add_argument("--concurrency", type=int, default=2)
    cs.add_argument("--by-script", action="store_true", help="µs per call of each script (slow log at 0)")
    pr = sub.add_parser("prelude", help="what a task-state script's prelude costs per call")
    pr.add_argument("scripts", nargs="+", help="script names in celery_ha/state, e.g. claim")
    pr.add_argument("--calls", type=int, default=4000)
    pr.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    binary = args.redis_server or shutil.which("redis-server") or ""
    if args.mode == "commandstats":
        commandstats(binary, args.kind, args.tasks, args.concurrency, args.systems, args.by_script)
    else:
        prelude(binary, args.scripts, args.calls, args.rounds)


if __name__ == "__main__":
    main()
