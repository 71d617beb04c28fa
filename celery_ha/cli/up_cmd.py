"""``celery-ha up``: Redis, a worker, beat, Flower and the web dashboard, supervised together; Ctrl-C
stops them all."""

from __future__ import annotations

import os
import secrets
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from celery_ha.base.masking import mask_url
from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.runtime.embedded import EmbeddedRedis
from celery_ha.runtime.redis_process import create_secret, secure_dir
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


#: The user of a generated Flower login.
FLOWER_USER = "celery-ha"
#: Where a generated Flower login is kept (in the data directory, mode 0600).
FLOWER_AUTH_FILE = "flower.auth"


@dataclass(frozen=True)
class FlowerAuth:
    """Flower's basic-auth credentials (``user:password[,user:password]``) and where they came from."""

    credentials: str = field(repr=False)
    source: str  # "CELERY_HA_FLOWER_AUTH", "FLOWER_BASIC_AUTH" or the file path
    generated: bool = False  # created just now: the one time its password is shown

    @property
    def users(self) -> str:
        return ", ".join(part.partition(":")[0] for part in self.credentials.split(","))


def flower_auth(obj: CLIContext, data_dir: Path) -> FlowerAuth:
    """``CELERY_HA_FLOWER_AUTH``, else Flower's own ``FLOWER_BASIC_AUTH``, else a login generated once
    and kept in ``DATA_DIR/flower.auth`` (0600, in the 0700 data directory)."""
    if obj.settings.flower_auth:
        return FlowerAuth(obj.settings.flower_auth, "CELERY_HA_FLOWER_AUTH")
    if os.environ.get("FLOWER_BASIC_AUTH"):
        return FlowerAuth(os.environ["FLOWER_BASIC_AUTH"], "FLOWER_BASIC_AUTH")
    path = secure_dir(data_dir) / FLOWER_AUTH_FILE
    credentials, created = create_secret(path, lambda: f"{FLOWER_USER}:{secrets.token_urlsafe(18)}")
    user, sep, password = credentials.partition(":")
    if not (sep and user and password):
        raise click.ClickException(f"{path} must hold USER:PASSWORD; delete it to generate a new login")
    return FlowerAuth(credentials, str(path), generated=created)


def build_plan(obj: CLIContext, app: str, env: dict[str, str], data_dir: Path, *, concurrency: int | None,
               loglevel: str, no_beat: bool, no_flower: bool, flower_port: int,
               auth: FlowerAuth | None, web_port: int | None = None
               ) -> list[tuple[str, list[str], dict[str, str]]]:
    """The children ``up`` supervises: (name, argv, environment) each.

    Flower gets its login through ``FLOWER_BASIC_AUTH`` in its own environment, which Flower reads
    like ``--basic-auth``: a command line is readable by every local user (``ps``, /proc/PID/cmdline),
    a process's environment only by its owner.
    """
    node = f"worker-{obj.namespace}-{os.getpid()}@%h"
    worker = ["worker", "--loglevel", loglevel, "-n", node]
    if concurrency:
        worker += ["--concurrency", str(concurrency)]
    plan: list[tuple[str, list[str], dict[str, str]]] = [("worker", celery_argv(app, *worker), env)]
    if not no_beat:
        data_dir.mkdir(parents=True, exist_ok=True)
        schedule = data_dir / f"celerybeat-schedule-{obj.namespace}"
        plan.append(("beat", celery_argv(app, "beat", "--loglevel", loglevel, "-s", str(schedule)), env))
    if not no_flower:
        assert auth is not None
        plan.append(("flower", celery_argv(app, "flower", f"--port={flower_port}", "--address=127.0.0.1"),
                     {**env, "FLOWER_BASIC_AUTH": auth.credentials}))
    if web_port is not None:  # `celery-ha web` on loopback; CELERY_HA_WEB_AUTH (if set) reaches it
        plan.append(("web", [sys.executable, "-m", "celery_ha.cli", "web", "--port", str(web_port)], env))
    return plan


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """A busy dashboard port is one line now, not a child that dies and takes ``up`` down with it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise click.ClickException(f"cannot use {host}:{port} for the dashboard ({exc.strerror}): "
                                       "pass --web-port PORT or --no-web") from None


def _announce_flower(auth: FlowerAuth, port: int) -> None:
    click.echo(f"  Flower: http://127.0.0.1:{port} (basic auth, user {auth.users})")
    if auth.generated:
        user, _, password = auth.credentials.partition(":")
        click.echo(f"  Flower login generated now, shown this once: user {user}  password {password}\n"
                   f"    kept in {auth.source} (mode 0600); set CELERY_HA_FLOWER_AUTH=user:password to "
                   "choose your own")
    elif auth.source.startswith("/"):
        click.echo(f"    password in {auth.source}")
    else:
        click.echo(f"    password from ${auth.source}")


@click.command("up")
@click.option("--concurrency", "-c", type=click.IntRange(1, 512), default=None,
              help="Worker pool processes.  [default: number of CPUs]")
@click.option("--no-flower", is_flag=True, help="Do not start Flower.")
@click.option("--no-beat", is_flag=True, help="Do not start beat (another host runs it).")
@click.option("--flower-port", type=click.IntRange(1, 65535), default=5555, show_default=True)
@click.option("--no-web", is_flag=True, help="Do not start the dashboard (celery-ha web).")
@click.option("--web-port", type=click.IntRange(1, 65535), default=8808, show_default=True,
              help="Port of the dashboard and /metrics on 127.0.0.1.")
@click.option("--loglevel", "-l", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
@click.option("--app", "app", default="celery_ha", hidden=True, help="Celery app to run.")
@pass_cli
def command(obj: CLIContext, concurrency: int | None, no_flower: bool, no_beat: bool, flower_port: int,
            no_web: bool, web_port: int, loglevel: str, app: str) -> None:
    """Run everything on this machine: Redis (embedded unless configured), one worker, beat, Flower and
    the dashboard (celery-ha web, http://127.0.0.1:8808; CELERY_HA_WEB_AUTH=user:password for actions).

    Children are restarted if they crash (up to 5 times a minute); Ctrl-C or SIGTERM stops them all
    cleanly (warm shutdown: running tasks hand their leases back).
    """
    obj.start_embedded = True  # `up` is the one-machine setup: it may start the embedded Redis
    url = obj.redis_url  # starts the embedded Redis now, before any child races to do it
    obj.client.ping()  # an unreachable Redis is one clear line here, not five crashing children
    embedded = EmbeddedRedis(obj.settings.data_dir)
    data_dir = embedded.data_dir
    auth = None if no_flower else flower_auth(obj, data_dir)
    env = child_env(obj)
    if not no_web:
        check_port_free(web_port)
    plan = build_plan(obj, app, env, data_dir, concurrency=concurrency, loglevel=loglevel, no_beat=no_beat,
                      no_flower=no_flower, flower_port=flower_port, auth=auth,
                      web_port=None if no_web else web_port)

    click.echo(f"celery-ha up: Redis {mask_url(url)}, namespace {obj.namespace}")
    if not obj.external and embedded.secured is False:
        click.echo("Warning: the embedded Redis has no password (started by an older celery-ha); stop "
                   "everything and run `celery-ha redis stop` to have it restart secured", err=True)
    sup = Supervisor(stop_timeout=30.0)
    history: list[float] = []
    with sup.running():
        try:
            for name, argv, child_environment in plan:
                child = sup.start(name, argv, child_environment, cwd=Path.cwd())
                click.echo(f"  started {name} (pid {child.pid})")
            if auth is not None:
                _announce_flower(auth, flower_port)
            if not no_web:
                login = ("basic auth" if obj.settings.web_auth
                         else "read-only; set CELERY_HA_WEB_AUTH=user:password for actions")
                click.echo(f"  dashboard: http://127.0.0.1:{web_port} (/metrics for Prometheus; {login})")
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
            sup.stop_all(order=["web", "beat", "flower", "worker"])
    click.echo("all processes stopped")
