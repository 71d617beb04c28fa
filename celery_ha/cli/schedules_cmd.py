"""``celery-ha schedules list|set|unset``: refetch schedules per task name and host, kept in Redis."""

from __future__ import annotations

import click

from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.known import force_option, require_known, warn_unknown
from celery_ha.cli.render import console, echo_json, grid
from celery_ha.state.schedules import Schedule


@click.group("schedules")
def command() -> None:
    """Refetch schedules: a finished task runs again when its interval has passed since its
    completion, queued by the maintenance sweep through the host gate, without anyone enqueueing
    it again and however old its completion is.

    A schedule is set for a task name (crawl_list daily), a host (every task of news.example
    hourly) or both (fetch_page on news.example); the most specific applies, and --every 0 makes an
    exception (never). Adaptive schedules follow Nutch: the interval grows x1.4 after a run whose
    output did not change (a 304, or the same ctx.signature) and shrinks x0.8 after one that did,
    within --min/--max. Schedules apply from each task's next completion; every process reads the
    same ones from Redis.
    """


def _every(seconds: float) -> str:
    if seconds == 0:
        return "never"
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _row(s: Schedule) -> tuple[str, ...]:
    bounds = f"{_every(s.min_every)}..{_every(s.max_every)}" if s.adaptive else "-"
    return (s.task or "*", s.host or "*", _every(s.every), "yes" if s.adaptive else "no", bounds)


@command.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_cli
def list_schedules(obj: CLIContext, as_json: bool) -> None:
    """List the schedules, and how many runs wait for their time or are due now."""
    warn_unknown(obj)
    schedules = obj.queue.schedules()
    pending = obj.queue.refetch_pending()
    if as_json:
        echo_json({"namespace": obj.namespace, "schedules": [s.as_dict() for s in schedules], **pending})
        return
    if not schedules:
        click.echo(f"no refetch schedules in namespace {obj.namespace}")
    else:
        console().print(grid(("task", "host", "every", "adaptive", "bounds"), [_row(s) for s in schedules],
                             title=f"refetch schedules of {obj.namespace}"))
    click.echo(f"{pending['waiting']} run(s) waiting for their time, {pending['due']} due now")


@command.command("set")
@click.option("--task", help="Durable task name (e.g. crawl_list).")
@click.option("--host", help="Host (e.g. news.example), as the host gate keys it.")
@click.option("--every", required=True, metavar="AGE",
              help="Interval after each completion: 90s, 15m, 6h, 1d, 1w; 0 = never (an exception).")
@click.option("--adaptive", is_flag=True, help="Grow the interval while the output does not change, "
                                               "shrink it when it does (x1.4 / x0.8).")
@click.option("--min", "min_every", metavar="AGE", help="Adaptive: shortest interval (default: every/4).")
@click.option("--max", "max_every", metavar="AGE", help="Adaptive: longest interval (default: 8 x every).")
@force_option
@pass_cli
def set_schedule(obj: CLIContext, task: str | None, host: str | None, every: str, adaptive: bool,
                 min_every: str | None, max_every: str | None, force: bool) -> None:
    """Set the refetch schedule of a task name, a host, or a task on a host."""
    if task is None and host is None:
        raise click.UsageError("give --task, --host, or both")
    require_known(obj, force)
    s = obj.queue.set_schedule(task, host, every=every, min_every=min_every, max_every=max_every,
                               adaptive=adaptive)
    what = " on ".join(x for x in (s.task and f"task {s.task}", s.host and f"host {s.host}") if x)
    extra = f", adaptive within {_every(s.min_every)}..{_every(s.max_every)}" if s.adaptive else ""
    click.echo(f"{what}: refetch every {_every(s.every)}{extra} (from each task's next completion)")


@command.command("unset")
@click.option("--task", help="Durable task name.")
@click.option("--host", help="Host.")
@force_option
@pass_cli
def unset_schedule(obj: CLIContext, task: str | None, host: str | None, force: bool) -> None:
    """Remove a schedule (runs already waiting keep their time)."""
    if task is None and host is None:
        raise click.UsageError("give --task, --host, or both")
    require_known(obj, force)
    if not obj.queue.unset_schedule(task, host):
        raise click.ClickException("no such schedule")
    click.echo("schedule removed")
