"""``celery-ha up``: Redis, a worker, beat and Flower, supervised together; Ctrl-C stops them all."""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.redisio.urls import mask_url
from celery_ha.runtime.embedded import EmbeddedRedis
from celery_ha.runtime.supervisor import Supervisor, celery_argv

#: A child that keeps dying is given up on after this many restarts within RESTART_WINDOW seconds.
MAX_RESTARTS = 5
RESTART_WINDOW = 60.0


def child_env(obj: CLIContext, **extra: str) -> dict[str, str]:
    """Environment for Celery children: the *resolved* Redis URL and namespace, so they all attach to
    the same Redis whatever their working directory, and the broker defaults to it."""
    env = dict(os.environ)
    env["CELERY_HA_REDIS_URL"] = obj.redis_url
    env["CELERY_HA_NAMESPACE"] = obj.namespace
    env.setdefault("CELERY_BROKER_URL", obj.redis_url)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra)
    return env


@click.command("up")
@click.option("--concurrency", "-c", type=click.IntRange(1, 512), default=None,
              help="Worker pool processes.  [default: number of CPUs]")
@click.option("--no-flower", is_flag=True, help="Do not start Flower.")
@click.option("--no-beat", is_flag=True, help="Do not start beat (another host runs it).")
@click.option("--flower-port", type=click.IntRange(1, 65535), default=5555, show_default=True)
@click.option("--loglevel", "-l", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
@click.option("--app", "app", default="celery_ha", hidden=True, help="Celery app to run.")
@pass_cli
def command(obj: CLIContext, concurrency: int | None, no_flower: bool, no_beat: bool, flower_port: int,
            loglevel: str, app: str) -> None:
    """Run everything on this machine: Redis (embedded unless configured), one worker, beat, Flower.

    Children are restarted if they crash (up to 5 times a minute); Ctrl-C or SIGTERM stops them all
    cleanly (warm shutdown: running tasks hand their leases back).
    """
    url = obj.redis_url  # starts the embedded Redis now, before any child races to do it
    obj.client.ping()  # an unreachable Redis is one clear line here, not five crashing children
    data_dir = EmbeddedRedis(obj.settings.data_dir).data_dir
    env = child_env(obj)
    node = f"worker-{obj.namespace}-{os.getpid()}@%h"
    worker = ["worker", "--loglevel", loglevel, "-n", node]
    if concurrency:
        worker += ["--concurrency", str(concurrency)]
    plan: list[tuple[str, list[str]]] = [("worker", celery_argv(app, *worker))]
    if not no_beat:
        data_dir.mkdir(parents=True, exist_ok=True)
        schedule = data_dir / f"celerybeat-schedule-{obj.namespace}"
        plan.append(("beat", celery_argv(app, "beat", "--loglevel", loglevel, "-s", str(schedule))))
    if not no_flower:
        plan.append(("flower", celery_argv(app, "flower", f"--port={flower_port}", "--address=127.0.0.1")))

    click.echo(f"celery-ha up: Redis {mask_url(url)}, namespace {obj.namespace}")
    sup = Supervisor(stop_timeout=30.0)
    history: list[float] = []
    with sup.running():
        try:
            for name, argv in plan:
                child = sup.start(name, argv, env, cwd=Path.cwd())
                click.echo(f"  started {name} (pid {child.pid})")
            if not no_flower:
                click.echo(f"  Flower: http://127.0.0.1:{flower_port}")
            click.echo("Ctrl-C to stop.")
            while True:
                for child in sup.exited():
                    now = time.monotonic()
                    history[:] = [t for t in history if now - t < RESTART_WINDOW] + [now]
                    code = child.proc.returncode if child.proc else None
                    if len(history) > MAX_RESTARTS:
                        raise click.ClickException(
                            f"{child.name} exited (code {code}) {len(history)} times in "
                            f"{RESTART_WINDOW:.0f}s; stopping everything")
                    click.echo(f"  {child.name} exited (code {code}); restarting", err=True)
                    sup.restart(child.name)
                time.sleep(0.5)  # supervision tick
        except KeyboardInterrupt:
            click.echo("\nstopping...", err=True)
        finally:
            sup.stop_all(order=["beat", "flower", "worker"])
    click.echo("all processes stopped")
