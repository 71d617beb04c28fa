"""``celery-ha demo`` end to end: start everything, crawl with chaos, verify, report, clean up.

Real processes, real sockets: the site and the proxy farm run as threads of this process (they
must outlive the chaos), the Celery workers and beat run as child processes in their own process
groups (so a whole worker can be killed like a host dying, and so nothing survives the demo). The
demo gets its own namespace and its own broker database, so it never mixes with a `celery-ha up`
running on the same Redis.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import click
import redis
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.masking import mask_url
from celery_ha.base.settings import Settings
from celery_ha.demo.chaos import Chaos
from celery_ha.demo.proxy_farm import ProxyFarm
from celery_ha.demo.report import DemoReport
from celery_ha.demo.site import DemoSite
from celery_ha.demo.verify import verify
from celery_ha.proxy import ProxyPool
from celery_ha.redisio.client import redis_client
from celery_ha.runtime.embedded import EmbeddedRedis
from celery_ha.runtime.redis_process import free_port
from celery_ha.runtime.supervisor import Supervisor, celery_argv
from celery_ha.state import TaskQueue
from celery_ha.state.keys import QueueKeys
from celery_ha.state.purge import purge_namespace
from celery_ha.state.worker_registry import alive_count


class DemoTarget(Protocol):
    """Where the demo runs: what the CLI context knows (the demo is below the CLI, so it only names
    the attributes it reads)."""

    namespace_option: str | None
    settings: Settings

    @property
    def external(self) -> bool: ...

    @property
    def redis_url(self) -> str: ...


DEMO_NAMESPACE = "demo"
PAGE_SIZE = 20
#: Knobs for the worker processes: short leases and sweeps so failovers show within seconds.
WORKER_ENV = {
    "CELERY_HA_LEASE_TTL": "6",
    "CELERY_HA_HEARTBEAT_INTERVAL": "1",
    "CELERY_HA_RECLAIM_INTERVAL": "1",
    "CELERY_HA_REDISPATCH_AFTER": "30",
    "CELERY_HA_MAX_ATTEMPTS": "6",
    "CELERY_HA_MAX_STALLS": "6",
    "CELERY_HA_SOFT_SHUTDOWN_TIMEOUT": "2",
    "CELERY_HA_TASK_TIME_LIMIT": "60",
}
#: The site allows SITE_LIMIT requests per client IP per second; the pool keeps each proxy under it.
SITE_LIMIT = (12, 1.0)
POOL_RATE = "8/1"


@dataclass
class DemoOptions:
    pages: int = 2000
    workers: int = 2
    concurrency: int = 4
    chaos: bool = True
    timeout: float = 300.0
    proxies: int = 12
    report_json: Path | None = None
    web: bool = True  # run `celery-ha web` on the demo's namespace while it crawls


@dataclass
class Plan:
    """Chaos schedule: (fraction of pages done, action), consumed in order."""

    steps: list[tuple[float, str]] = field(default_factory=list)

    @classmethod
    def default(cls, chaos: bool) -> Plan:
        if not chaos:
            return cls([])
        return cls([(0.10, "child"), (0.22, "child"), (0.35, "worker"), (0.50, "child"), (0.65, "child"),
                    (0.80, "child")])


def broker_url_for(url: str) -> str:
    """The demo's broker: same Redis, next database, so its queues are its own."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        return url
    try:
        db = int(parts.path.strip("/") or 0)
    except ValueError:
        db = 0
    return urlunsplit((parts.scheme, parts.netloc, f"/{(db + 1) % 16}", parts.query, parts.fragment))


def dashboard_port(preferred: int = 8808) -> int:
    """The dashboard's usual port when it is free (a `celery-ha up` may hold it), else any free one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
        except OSError:
            return free_port()
    return preferred


def prepare_namespace(client: redis.Redis, namespace: str) -> None:
    """Start from an empty namespace, but never wipe one the demo did not create."""
    keys = QueueKeys(namespace)
    has_data = next(iter(client.scan_iter(match=keys.prefix + "*", count=100)), None) is not None
    if has_data and client.hget(keys.meta, "demo") != "1":
        raise ConfigurationError(f"namespace {namespace!r} holds data the demo did not create; "
                                 "pick another one with --namespace")
    purge_namespace(client, namespace)
    client.hset(keys.meta, "demo", "1")


def inject_failures(site: DemoSite, pages: int) -> set[int]:
    """A few 404s (dead letters), 503s, captchas and 429s (retried); returns the 404 case numbers."""
    step = max(1, pages // 40)
    cases = list(range(7, pages, step))
    permanent = set(cases[0:max(1, min(5, pages // 400)) * 4:4])
    transient = [n for n in cases if n not in permanent]
    for i, n in enumerate(transient[: max(4, pages // 100)]):
        kind = ("503", "captcha", "429", "503")[i % 4]
        site.fail(f"/case/{n}", kind, times=1)
    for n in permanent:
        site.fail(f"/case/{n}", "404")
    if pages > 2 * PAGE_SIZE:
        site.fail("/cases?page=2", "503", times=1)  # the list crawl retries from its checkpoint
    return permanent


class Demo:
    """One demo run; ``run()`` returns the report (cleanup is the caller's ``close()``)."""

    def __init__(self, obj: DemoTarget, opts: DemoOptions, console: Console) -> None:
        self.obj = obj
        self.opts = opts
        self.console = console
        self.namespace = obj.namespace_option or DEMO_NAMESPACE
        self.embedded = EmbeddedRedis(obj.settings.data_dir)
        self.started_redis = False
        self.sup = Supervisor(stop_timeout=8.0)
        self.site: DemoSite | None = None
        self.farm: ProxyFarm | None = None
        self.worker_pids: dict[str, int] = {}
        self.workers_started = 0
        self.notes: list[str] = []  # problems: the run is not verified
        self.warnings: list[str] = []  # worth saying, but the output can still be verified
        self._worker_step_waited = 0

    # ------------------------------------------------------------------ setup
    def _redis(self) -> str:
        if not self.obj.external:
            self.started_redis = not self.embedded.status().running
        return self.obj.redis_url

    def _env(self, url: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(WORKER_ENV)
        env.update({"CELERY_HA_REDIS_URL": url, "CELERY_HA_NAMESPACE": self.namespace,
                    "CELERY_BROKER_URL": broker_url_for(url), "CELERY_HA_PROXY_RATE": POOL_RATE,
                    "PYTHONUNBUFFERED": "1"})
        return env

    def _start_worker(self, env: dict[str, str], logs: Path) -> str:
        self.workers_started += 1
        name = f"worker-{self.workers_started}"
        argv = celery_argv("celery_ha", "worker", "--loglevel", "warning", "-c", str(self.opts.concurrency),
                           "-n", f"demo-{self.workers_started}@%h",
                           "--without-gossip", "--without-mingle")
        child = self.sup.start(name, argv, env, log=logs / f"{name}.log")
        assert child.pid is not None
        self.worker_pids[name] = child.pid
        return name

    def _check_children(self) -> None:
        for child in self.sup.exited():
            tail = ""
            if child.log and child.log.exists():
                lines = [ln for ln in child.log.read_text(errors="replace").splitlines() if ln.strip()]
                tail = lines[-1] if lines else ""
            code = child.proc.returncode if child.proc else "?"
            raise ConfigurationError(f"{child.name} exited with code {code}: {tail} (log: {child.log})")

    def _wait_for_workers(self, client: redis.Redis, want: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while alive_count(client, self.namespace, max_age=10) < want:
            self._check_children()
            if time.monotonic() > deadline:
                raise ConfigurationError(f"workers did not come up within {timeout:.0f}s")
            time.sleep(0.1)

    # ------------------------------------------------------------------ the run
    def run(self) -> DemoReport:
        opts = self.opts
        started = time.monotonic()
        url = self._redis()
        client = redis_client(url)
        prepare_namespace(client, self.namespace)
        queue = TaskQueue(client, self.namespace)
        workdir = self.embedded.data_dir / "demo"
        logs = workdir / "logs"
        for old in logs.glob("*.log") if logs.exists() else []:
            old.unlink()

        self.site = DemoSite(total=opts.pages, page_size=PAGE_SIZE, rate_limit=SITE_LIMIT).start()
        permanent = inject_failures(self.site, opts.pages)
        password = secrets.token_urlsafe(8)
        self.farm = ProxyFarm(opts.proxies, first=2, auth=("demo", password)).start()
        pool = ProxyPool(client, self.namespace)
        pool.add_many(self.farm.urls, source="demo-farm")
        self.console.print(f"Redis {mask_url(url)} · namespace [bold]{self.namespace}[/bold] · site "
                           f"{self.site.url} ({opts.pages} cases, {self.site.pages} list pages) · "
                           f"{opts.proxies} proxies on 127.0.0.2-{1 + opts.proxies} "
                           f"({mask_url(self.farm.urls[0])} ...)")

        env = self._env(url)
        for _ in range(opts.workers):
            self._start_worker(env, logs)
        workdir.mkdir(parents=True, exist_ok=True)
        self.sup.start("beat", celery_argv("celery_ha", "beat", "--loglevel", "warning", "-s",
                                           str(workdir / "celerybeat-schedule")), env, log=logs / "beat.log")
        self.console.print(f"starting {opts.workers} worker(s) x {opts.concurrency} processes and beat "
                           f"(logs in {logs}) ...")
        if opts.web:
            port = dashboard_port()
            self.sup.start("web", [sys.executable, "-m", "celery_ha.cli", "web", "--port", str(port)], env,
                           log=logs / "web.log")
            self.console.print(f"dashboard http://127.0.0.1:{port} (metrics at /metrics) while the demo runs")
        self._wait_for_workers(client, opts.workers * opts.concurrency)
        self.console.print(f"workers ready after {time.monotonic() - started:.1f}s; crawling")

        crawl_id = queue.enqueue(self.site.list_url(), task="crawl_list", meta={"follow": True})
        chaos = Chaos(client, queue, self.namespace)
        plan = Plan.default(opts.chaos)
        total = opts.pages + 1
        timed_out = False
        with Progress(TextColumn("[bold]crawling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[info]}"), console=self.console, transient=False) as progress:
            bar = progress.add_task("crawl", total=total, info="")
            deadline = started + opts.timeout
            while True:
                stats = queue.stats()
                done = int(stats["completed"]) + int(stats["dead"])
                pending = sum(int(stats[k]) for k in ("queued", "dispatched", "running", "delayed"))
                chaos.update()
                hits = self.site.requests
                n429 = sum(1 for r in hits if r.status == 429)
                progress.update(bar, completed=min(done, total), info=(
                    f"running {stats['running']} · queued {stats['queued']} · retrying {stats['delayed']} · "
                    f"dead {stats['dead']} · 429s {n429} · kills {len(chaos.failovers)}"))
                if plan.steps and done >= plan.steps[0][0] * total:
                    self._chaos_step(plan, chaos, env, logs, progress.console)
                crawl_state = queue.get(crawl_id).state
                if crawl_state in ("completed", "dead") and pending == 0:
                    break
                for child in self.sup.exited():
                    progress.console.print(f"[yellow]{child.name} exited unexpectedly; restarting[/yellow]")
                    self.notes.append(f"{child.name} exited unexpectedly")
                    self.sup.restart(child.name)
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(0.1)
            progress.update(bar, completed=min(int(queue.stats()["completed"]) + int(queue.stats()["dead"]),
                                               total))
        if timed_out:
            self.notes.append(f"timed out after {opts.timeout:.0f}s with work still pending")
        for step in plan.steps:
            self.warnings.append(f"chaos step '{step[1]}' at {step[0]:.0%} never ran (no busy process then)")
        chaos.update()
        for f in chaos.failovers:
            if f.held and f.latency is None:
                self.notes.append(f"failover of {f.victim} did not complete")
        verification = verify(client, queue, self.namespace, self.site.url, opts.pages, permanent)
        hits = self.site.requests
        return DemoReport(
            verification=verification, elapsed=time.monotonic() - started, stats=queue.stats(),
            failovers=chaos.failovers, status_counts=dict(Counter(r.status for r in hits)),
            client_ips=len({r.client_ip for r in hits}), proxies=opts.proxies,
            workers_started=self.workers_started, notes=self.notes, warnings=self.warnings)

    def _chaos_step(self, plan: Plan, chaos: Chaos, env: dict[str, str], logs: Path, out: Console) -> None:
        action = plan.steps[0][1]
        if action == "child":
            live = [pid for name, pid in self.worker_pids.items() if self.sup.children[name].alive()]
            event = chaos.kill_busy_child(live)
            if event is None:
                return  # nobody busy this instant: try again on the next tick
            out.print(f"[red]chaos[/red] SIGKILL pool child {event.victim} holding {len(event.held)} task(s)")
        else:
            live = {n: pid for n, pid in self.worker_pids.items() if self.sup.children[n].alive()}
            if not live:
                plan.steps.pop(0)
                return
            held = chaos.leases_by_worker(live)
            name = max(live, key=lambda n: held[n])
            self._worker_step_waited += 1
            if held[name] == 0 and self._worker_step_waited < 30:
                return  # wait (up to ~3 s of ticks) for a worker that holds leases: a real failover
            pgid = self.worker_pids.pop(name)
            event = chaos.kill_worker(name, pgid)
            self.sup.kill(name)
            replacement = self._start_worker(env, logs)
            out.print(f"[red]chaos[/red] SIGKILL whole {name} (holding {len(event.held)} task(s)); "
                      f"started {replacement}")
        plan.steps.pop(0)

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Stop everything this demo started, whatever happened before."""
        self.sup.stop_all()
        if self.farm is not None:
            self.farm.stop()
        if self.site is not None:
            self.site.stop()
        if self.started_redis:
            with contextlib.suppress(Exception):
                self.embedded.stop()


def run_demo(obj: DemoTarget, opts: DemoOptions) -> bool:
    """Run the demo; True only if the report verifies 0 lost and 0 duplicate items."""
    console = Console(highlight=False, width=None if os.isatty(1) else 120)
    demo = Demo(obj, opts, console)
    demo.sup.install_signals()
    report: DemoReport | None = None
    try:
        report = demo.run()
    except KeyboardInterrupt:
        console.print("\n[yellow]interrupted: stopping everything the demo started ...[/yellow]")
        raise click.Abort() from None
    finally:
        demo.close()
    report.render(console)
    if opts.report_json is not None:
        opts.report_json.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    return report.ok

