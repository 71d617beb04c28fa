"""A user's own Celery app with ``celery_ha.init_app``: a separate project, real workers, SIGKILL.

The project lives in a temporary folder with its own ``myproj/celery.py`` (``Celery("myproj")`` +
``init_app``), a durable task and a plain Celery task of its own, and — in the folder the worker starts
from — a ``tasks.py`` and a ``celeryconfig.py`` of the kind most Celery projects have. The worker runs
without this repository on its path, as an installed celery-ha would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_ha.state import TaskQueue
from celery_ha.state.sink import count_items, iter_items
from celery_ha.state.worker_registry import list_workers, node_infos
from tests.support.polling import wait_until

CELERY = str(Path(sys.executable).parent / "celery")
CELERY_HA = str(Path(sys.executable).parent / "celery-ha")
LEASE_TTL = 30.0  # long: a task back in work within a few seconds was released by fast failover

CELERY_PY = '''
import os
from celery import Celery
import celery_ha

app = Celery("myproj")
app.config_from_object("myproj.settings")
celery_ha.init_app(app, redis_url=os.environ["MYPROJ_REDIS"], namespace=os.environ["MYPROJ_NS"],
                   lease_ttl=30, heartbeat_interval=1, reclaim_interval=1, redispatch_after=5,
                   soft_shutdown_timeout=1, extra_imports="myproj.tasks")
'''
SETTINGS_PY = '''
import os
broker_url = os.environ["MYPROJ_BROKER"]
result_backend = os.environ["MYPROJ_RESULTS"]  # the project's own tasks keep their results
task_default_queue = "myproj-default"
'''
TASKS_PY = '''
import time
from myproj.celery import app
from celery_ha import durable_task


@durable_task(name="myproj_page")
def page(ctx):
    """Slow enough to be caught running; emits one item keyed by URL."""
    time.sleep(float((ctx.meta or {}).get("sleep", 0.5)))
    ctx.emit({"url": ctx.url, "attempt": ctx.attempt}, key=ctx.url)


@app.task(name="myproj.add")
def add(x, y):
    return x + y
'''
# What a typical Celery project keeps in its working directory: neither may change celery-ha.
USER_TASKS_PY = "raise RuntimeError('the user tasks.py was imported by celery-ha')\n"
USER_CELERYCONFIG_PY = "task_acks_late = False\nbroker_url = 'redis://127.0.0.1:1/0'\n"


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CELERY_", "CELERY_HA_", "DJANGO_")) and k != "PYTHONPATH"}
    return {**env, **extra}


class Project:
    """The user's project on disk, and the processes started from it."""

    def __init__(self, root: Path, redis_base: str) -> None:
        self.root = root
        self.namespace = f"own{uuid.uuid4().hex[:8]}"
        base = redis_base.rsplit("/", 1)[0]
        self.state_url, self.broker_url = f"{base}/0", f"{base}/7"
        package = root / "myproj"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "celery.py").write_text(CELERY_PY)
        (package / "settings.py").write_text(SETTINGS_PY)
        (package / "tasks.py").write_text(TASKS_PY)
        (root / "tasks.py").write_text(USER_TASKS_PY)
        (root / "celeryconfig.py").write_text(USER_CELERYCONFIG_PY)
        self.results_url = f"{base}/8"
        self.env = _clean_env(MYPROJ_REDIS=self.state_url, MYPROJ_BROKER=self.broker_url,
                              MYPROJ_RESULTS=self.results_url,
                              MYPROJ_NS=self.namespace, PYTHONPATH=str(root))
        self.q = TaskQueue.from_url(self.state_url, namespace=self.namespace, lease_ttl=LEASE_TTL)
        self.r = redis.Redis.from_url(self.state_url, decode_responses=True)
        redis.Redis.from_url(self.broker_url).flushdb()
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str, name: str, app: str = "myproj", **env: str) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "wb")
        proc = subprocess.Popen([CELERY, "-A", app, *args], cwd=self.root, env={**self.env, **env},
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def worker(self, node: str, concurrency: int = 2) -> subprocess.Popen[bytes]:
        proc = self.start("worker", "-P", "prefork", "-c", str(concurrency), "-n", node, "--without-gossip",
                          "--without-mingle", "--without-heartbeat", "-l", "info", name=node.split("@")[0])
        wait_until(lambda: len(self.children(node)) >= concurrency, 60, 0.1, f"{node} to register")
        return proc

    def children(self, node: str) -> list[dict[str, object]]:
        return [w for w in list_workers(self.r, self.namespace, max_age=5.0) if w["node"] == node]

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        self.q.client.close()
        self.r.close()


@pytest.fixture
def project(tmp_path: Path, redis_server: object) -> Iterator[Project]:
    made = Project(tmp_path / "proj", redis_server.url)  # type: ignore[attr-defined]
    yield made
    made.stop()


def test_own_app_gets_fast_failover_and_exactly_once(project: Project) -> None:
    """`celery -A myproj worker`: the CLI's enqueue is dispatched, a SIGKILLed pool child's task is
    back in work within a few seconds (the lease would take 30), every item is in the sink once, and
    the project's own plain task still runs on its own queue."""
    node = f"own-{project.namespace}@localhost"
    project.worker(node)
    urls = [f"https://shop.test/p/{i}" for i in range(8)]
    wait_until(lambda: node_infos(project.r, project.namespace, [node]).get(node, {}).get("broker"), 30, 0.05,
               "the worker's start-up report")
    # The CLI's broker is the state Redis (no CELERY_BROKER_URL): no worker reads it, so it says so
    # and sends no start-now message there; the worker's sweep dispatches the tasks.
    out = subprocess.run([CELERY_HA, "--redis-url", project.state_url, "-n", project.namespace, "enqueue",
                          *urls, "--task", "myproj_page", "--meta", '{"sleep": 1.5}', "--json"],
                         env=project.env, cwd=project.root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["pumped"] is False and "consume another broker" in out.stderr, out
    assert not project.r.exists(f"{project.namespace}.maintenance")
    out = subprocess.run([CELERY_HA, "--redis-url", project.state_url, "-n", project.namespace, "enqueue",
                          "https://shop.test/extra", "--task", "myproj_page", "--json"],
                         env={**project.env, "CELERY_BROKER_URL": project.broker_url},
                         cwd=project.root, capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout)["pumped"] is True and "another broker" not in out.stderr, out
    urls.append("https://shop.test/extra")
    ids = project.q.task_ids(urls, task="myproj_page")

    def running() -> list[tuple[str, str]]:
        infos = project.q.get_many(ids)
        return [(i.id, str(i.worker)) for i in infos if i is not None and i.state == "running"]

    victim_id, holder = wait_until(running, 30, 0.05, "a task running on the user's worker")[0]
    pid = int(holder.rsplit(":", 1)[1])
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()

    def released() -> bool:
        info = project.q.get(victim_id)
        return info.state != "running" or str(info.worker) != holder

    wait_until(released, 10, 0.02, "the killed child's task to be released by fast failover")
    assert time.monotonic() - killed_at < LEASE_TTL / 3  # far sooner than the lease's expiry
    wait_until(lambda: project.q.stats()["completed"] == len(urls), 90, 0.1, "every page to complete")
    keys = [k for k, _ in iter_items(project.q.client, project.namespace, with_keys=True)]
    assert sorted(keys) == sorted(urls) and count_items(project.q.client, project.namespace) == len(urls)
    stats = project.q.stats()
    assert stats["dead"] == 0 and stats["queued"] == stats["running"] == 0

    from celery import Celery

    client = Celery("client", broker=project.broker_url, set_as_current=False)
    client.conf.update(task_serializer="json", accept_content=["json"], task_default_queue="myproj-default",
                       result_backend=project.results_url)
    assert client.send_task("myproj.add", args=[2, 3]).get(timeout=30) == 5  # the user's own task
    client.close()
    assert "the user tasks.py was imported" not in project.log(node.split("@")[0])


def test_user_tasks_and_celeryconfig_beside_the_ready_made_worker_change_nothing(project: Project) -> None:
    """`celery -A celery_ha worker` started from a folder holding a user's tasks.py and celeryconfig.py
    (acks_late off, another broker) runs celery-ha's own shipped tasks with celery-ha's settings."""
    env = {"CELERY_HA_REDIS_URL": project.state_url, "CELERY_BROKER_URL": project.broker_url,
           "CELERY_HA_NAMESPACE": project.namespace}
    code = ("import celery_ha, importlib; c = celery_ha.app.conf; "
            "[importlib.import_module(m) for m in c.imports]; "
            "print(c.task_acks_late, c.broker_url, 'fetch_page' in celery_ha.app.tasks)")
    out = subprocess.run([sys.executable, "-c", code], cwd=project.root, env={**project.env, **env},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", project.broker_url, "True"]
    node = f"ready-{project.namespace}@localhost"
    project.start("worker", "-P", "prefork", "-c", "1", "-n", node, "--without-gossip", "--without-mingle",
                  "--without-heartbeat", "-l", "info", name="ready", app="celery_ha", **env)
    wait_until(lambda: project.children(node), 60, 0.1, "the ready-made worker to register")
    tid = project.q.enqueue("http://127.0.0.1:9/unreachable", task="crawl_list", max_attempts=1)
    wait_until(lambda: project.q.get(tid).state == "dead", 60, 0.1, "the shipped crawl_list to run")
    assert "No module named 'tasks.fetch'" not in project.log("ready")
    assert "the user tasks.py was imported" not in project.log("ready")


def test_a_setting_that_breaks_a_guarantee_is_refused_with_one_line(project: Project) -> None:
    """The user's app sets worker_prefetch_multiplier=4 (worker-wide, so celery-ha's tasks cannot set
    their own): the worker stops at start-up, one line naming it. Its task_acks_late=False is the app's
    own tasks' business (celery-ha's set theirs per task): not named."""
    (project.root / "myproj" / "settings.py").write_text(SETTINGS_PY + "task_acks_late = False\n"
                                                         "worker_prefetch_multiplier = 4\n")
    proc = project.start("worker", "-P", "solo", "-l", "info", name="refused")
    assert proc.wait(timeout=60) == 2
    lines = [line for line in project.log("refused").splitlines() if line.strip()]
    assert lines and lines[-1].startswith("celery-ha: configuration error:")
    assert "worker_prefetch_multiplier=4" in lines[-1] and "task_acks_late" not in lines[-1]
    assert "Traceback" not in project.log("refused")


def test_hooks_act_only_for_their_own_app(project: Project) -> None:
    """Two apps in one process: a worker of a plain Celery app (not attached) gets none of celery-ha's
    hooks — it registers no celery-ha worker — although celery-ha is attached to another app there."""
    (project.root / "plain.py").write_text(textwrap.dedent('''
        import os
        from celery import Celery
        import myproj.celery  # celery-ha attached to myproj's app in this process
        app = Celery("plain", broker=os.environ["MYPROJ_BROKER"])
        app.conf.task_default_queue = "plain"
    '''))
    node = f"plain-{project.namespace}@localhost"
    project.start("worker", "-P", "prefork", "-c", "1", "-n", node, "--without-gossip", "--without-mingle",
                  "--without-heartbeat", "-l", "info", name="plain", app="plain")
    wait_until(lambda: "ready." in project.log("plain"), 60, 0.1, "the plain worker to be ready")
    own = f"own-{project.namespace}@localhost"
    project.worker(own, concurrency=1)  # the attached app's worker registers, as the proof it would
    assert not project.children(node)
    assert "celery-ha" not in project.log("plain")


def test_init_app_refuses_an_unknown_setting_at_once() -> None:
    from celery import Celery

    from celery_ha import init_app
    from celery_ha.base.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="unknown celery-ha setting 'lease_tll'"):
        init_app(Celery("typo", set_as_current=False), lease_tll=30)


def test_a_worker_without_a_redis_url_refuses_to_start(tmp_path: Path) -> None:
    """No CELERY_HA_REDIS_URL, no CELERY_HA_EMBEDDED: one line saying how to set either, exit 2, and no
    private Redis started (no data directory made)."""
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.run([CELERY, "-A", "celery_ha", "worker", "-P", "solo", "-l", "info"], cwd=tmp_path,
                              env=_clean_env(), stdout=out, stderr=subprocess.STDOUT, timeout=60)
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert proc.returncode == 2, lines
    assert lines == ["celery-ha: configuration error: no Redis configured: set CELERY_HA_REDIS_URL (e.g. "
                     "redis://host:6379/0), or CELERY_HA_EMBEDDED=1 to use the local embedded Redis "
                     "(development on one machine)"]
    assert not (tmp_path / ".celery-ha").exists()
