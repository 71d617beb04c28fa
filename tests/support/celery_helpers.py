"""Helpers for tests that run real ``celery worker`` / ``celery beat`` processes.

Every process is started in its own session (process group) and killed as a group in teardown.
Waiting is always polling with a deadline, never a bare sleep.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import redis
from celery import Celery

from celery_ha.base.settings import Settings
from celery_ha.integration.core.queues import broker_queue
from celery_ha.integration.dispatch.broker import kombu_broker
from celery_ha.integration.dispatch.pump import pump
from celery_ha.redisio.client import is_redis_url, redis_client
from celery_ha.state import TaskQueue
from celery_ha.state.worker_registry import list_workers
from tests.support.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).parent / "celery")
T = TypeVar("T")
_broker_dbs = itertools.cycle(range(1, 16))


def wait_for(predicate: Callable[[], T], timeout: float = 20.0, interval: float = 0.05,
             message: str = "condition") -> T:
    """:func:`tests.support.polling.wait_until` with the longer defaults real worker processes need."""
    return wait_until(predicate, timeout, interval, message)


class Cluster:
    """Workers and beats of one test: a fresh namespace and a fresh broker database (or, with
    ``broker_of``, the broker database of another cluster: two namespaces on one broker)."""

    def __init__(self, redis_base_url: str, tmp: Path, broker_of: Cluster | None = None,
                 state_url: str | None = None, broker_url: str | None = None, namespace: str | None = None,
                 **env: Any) -> None:
        base = redis_base_url.rsplit("/", 1)[0]
        self.namespace = namespace or f"t{uuid.uuid4().hex[:10]}"
        self.state_url = state_url or f"{base}/0"
        self.broker_url = broker_url or (broker_of.broker_url if broker_of else f"{base}/{next(_broker_dbs)}")
        self.tmp = tmp
        self.sentinel_master = str(env.get("CELERY_HA_SENTINEL_MASTER", "")) or None
        self.r = redis_client(self.state_url, sentinel_master=self.sentinel_master)
        # None for a broker that is not Redis (RabbitMQ): a fresh namespace has fresh queues there.
        self.broker = redis_client(self.broker_url, sentinel_master=self.sentinel_master) \
            if is_redis_url(self.broker_url) else None
        if broker_of is None and self.broker is not None:
            self.broker.flushdb()
        self.env = {
            "CELERY_HA_REDIS_URL": self.state_url,
            "CELERY_BROKER_URL": self.broker_url,
            "CELERY_HA_NAMESPACE": self.namespace,
            "CELERY_HA_LEASE_TTL": "3",
            "CELERY_HA_HEARTBEAT_INTERVAL": "0.5",
            "CELERY_HA_RECLAIM_INTERVAL": "1",
            "CELERY_HA_REDISPATCH_AFTER": "5",
            "CELERY_HA_SOFT_SHUTDOWN_TIMEOUT": "1",
            "CELERY_HA_EXTRA_IMPORTS": "tests.support.celery_tasks",
            **{k: str(v) for k, v in env.items()},
        }
        self.q = TaskQueue(redis_client(self.state_url, sentinel_master=self.sentinel_master), self.namespace,
                           lease_ttl=float(self.env["CELERY_HA_LEASE_TTL"]),
                           max_stalls=int(self.env.get("CELERY_HA_MAX_STALLS", 3)))
        self.crawl_queue = broker_queue(self.namespace)  # where this namespace's fetch messages travel
        self.procs: list[subprocess.Popen[bytes]] = []
        self._app: Celery | None = None

    # ------------------------------------------------------------------ processes
    def _spawn(self, args: list[str], name: str, extra_env: dict[str, str] | None = None
               ) -> subprocess.Popen[bytes]:
        env = {**os.environ, **self.env, **(extra_env or {}), "PYTHONPATH": str(ROOT)}
        log = open(self.tmp / f"{name}.log", "wb")
        proc = subprocess.Popen([CELERY, "-A", "celery_ha", *args], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        proc.log_path = self.tmp / f"{name}.log"  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def worker(self, name: str, concurrency: int = 2, wait: bool = True, heartbeat: bool = False,
               args: tuple[str, ...] = (), **env: Any) -> subprocess.Popen[bytes]:
        """A ``celery worker`` of this cluster; ``heartbeat`` keeps Celery's worker heartbeat events
        on (as in production: the worker's event loop publishes one every 2 s); ``args``: more
        options of ``celery worker``."""
        node = f"{name}-{self.namespace}@localhost"
        quiet = ["--without-gossip", "--without-mingle", *([] if heartbeat else ["--without-heartbeat"])]
        proc = self._spawn(["worker", "-P", "prefork", "-c", str(concurrency), "-n", node, *quiet,
                            "-l", "info", *args], name, {k: str(v) for k, v in env.items()})
        proc.node = node  # type: ignore[attr-defined]
        if wait:
            wait_for(lambda: len(self.children(node)) >= concurrency, timeout=30,
                     message=f"worker {node} to register {concurrency} children")
        return proc

    def beat(self, name: str = "beat") -> subprocess.Popen[bytes]:
        return self._spawn(["beat", "-s", str(self.tmp / f"{name}-schedule"), "-l", "info"], name)

    def children(self, node: str) -> list[dict[str, Any]]:
        return [w for w in list_workers(self.r, self.namespace, max_age=3.0) if w["node"] == node]

    def kill_group(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        if sig == signal.SIGKILL:
            proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in self.procs:
            self.kill_group(proc)
        self.procs.clear()
        if self._app is not None:
            self._app.close()
        self.r.close()
        if self.broker is not None:
            self.broker.close()

    # ------------------------------------------------------------------ client side
    @property
    def app(self) -> Celery:
        """A JSON-only Celery client on the test broker (to send raw messages, run the pump)."""
        if self._app is None:
            broker = kombu_broker(self.broker_url, self.settings())
            app = Celery("celery_ha_tests", broker=broker.url)
            app.conf.update(task_serializer="json", accept_content=["json"],
                            task_default_queue=self.crawl_queue, broker_connection_retry_on_startup=True,
                            broker_transport_options=broker.transport_options, broker_use_ssl=broker.use_ssl)
            self._app = app
        return self._app

    def send_raw(self, task_name: str, task_id: str, n: int = 1) -> None:
        for i in range(n):
            self.app.send_task(task_name, args=[task_id], queue=self.crawl_queue,
                               task_id=f"{task_id}.dup{i}")

    def settings(self) -> Settings:
        return Settings.from_env(self.env)

    def pump(self, window: int | None = None) -> int:
        """Run the real pump from the test process (as the CLI or a Django view would)."""
        return pump(self.q, self.app, self.settings(), window)

    def state(self, tid: str) -> str:
        return self.q.get(tid).state

    def all_completed(self, ids: list[str]) -> bool:
        return all(i is not None and i.state == "completed" for i in self.q.get_many(ids))

    def recovery(self, ids: list[str], after: str, timeout: float = 60.0) -> tuple[float, float]:
        """Seconds from now until the next task completes, and until all of ``ids`` have (a fault
        ``after`` just ended: the recovery times README reports)."""
        start = time.monotonic()
        done = self.q.stats()["completed"]
        wait_for(lambda: self.q.stats()["completed"] > done, timeout, 0.1, f"a page finished after {after}")
        first = time.monotonic() - start
        wait_for(lambda: self.all_completed(ids), timeout, 0.2, f"every page after {after}")
        return first, time.monotonic() - start

    def log_text(self, proc: subprocess.Popen[bytes]) -> str:
        return Path(proc.log_path).read_text(errors="replace")  # type: ignore[attr-defined]


def _monitor_lpushes(url: str, stop_word: str, seen: list[dict[str, Any]], ready: threading.Event) -> None:
    client = redis.Redis.from_url(url)
    with client.monitor() as monitor:
        ready.set()
        for command in monitor.listen():
            text = command["command"]
            if stop_word in text:
                return
            if text.startswith("LPUSH"):
                seen.append(command)


@contextlib.contextmanager
def watched_lpushes(url: str) -> Iterator[list[dict[str, Any]]]:
    """MONITOR the server of ``url`` while the block runs: the list it yields holds every LPUSH (a
    Celery message sent, by a client or a script: ``client_type`` says ``lua``) when the block ends."""
    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    stop_word = f"monitor-stop-{uuid.uuid4().hex[:8]}"
    watcher = threading.Thread(target=_monitor_lpushes, daemon=True, args=(url, stop_word, seen, ready))
    watcher.start()
    assert ready.wait(10), "MONITOR did not start"
    try:
        yield seen
    finally:
        client = redis.Redis.from_url(url)
        client.echo(stop_word)
        client.close()
        watcher.join(10)


def step_hits(site: Any, label: str) -> list[tuple[int, float]]:
    """(step, time) of every request the `test_steps` task made under ``/slow/<label>/``, as the demo
    site logged them: what a resumed task re-fetched, and when."""
    return [(int(req.path.rsplit("/", 1)[1]), req.time) for req in site.hits(prefix=f"/slow/{label}/")]


def pause_process(proc: subprocess.Popen[bytes], seconds: float) -> None:
    """SIGSTOP ``proc`` for ``seconds`` (a Redis frozen past its clients' socket timeout), then SIGCONT."""
    proc.send_signal(signal.SIGSTOP)
    paused = time.monotonic()
    wait_for(lambda: time.monotonic() - paused > seconds, timeout=seconds + 2, interval=0.05,
             message=f"a pause of {seconds} s")  # the pause itself is what is tested
    proc.send_signal(signal.SIGCONT)
