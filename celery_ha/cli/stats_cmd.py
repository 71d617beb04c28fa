"""``celery-ha stats``: counts per state, lifetime counters, and a live progress view."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import click
import redis
from rich.console import Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
from rich.table import Table
from rich.text import Text

from celery_ha.base.masking import mask_url
from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.errors import one_line
from celery_ha.cli.known import warn_unknown
from celery_ha.cli.params import FiniteFloatRange
from celery_ha.cli.render import console, echo_json, when
from celery_ha.monitoring.dashboard import Reader, stats_snapshot

STATES = ("queued", "delayed", "dispatched", "running", "completed", "dead")
PENDING = ("queued", "delayed", "dispatched", "running")


def snapshot(obj: CLIContext) -> dict[str, Any]:
    """Queue stats, pause, the proxy pool's summary and warnings: the same document as the web's
    ``/api/stats`` (one function builds both)."""
    return stats_snapshot(Reader(obj.client, obj.queue, obj.pool, worker_max_age=obj.settings.lease_ttl))


def _table(data: dict[str, Any], rate: float | None = None) -> Table:
    table = Table(title=f"namespace {data['namespace']}", header_style="bold")
    for name in (*STATES, "items"):
        table.add_column(name, justify="right")
    table.add_row(*(str(data.get(n, 0)) for n in (*STATES, "items")))
    extra = Table(show_header=False, box=None)
    extra.add_column(style="bold")
    extra.add_column()
    for name in ("enqueued", "duplicates", "claimed", "failed", "retried", "reclaimed", "released",
                 "redriven", "recrawled", "refetched", "items_duplicate", "remembered"):
        extra.add_row(name, str(data.get(name, 0)))
    if rate is not None:
        extra.add_row("rate", f"{rate:.1f} tasks/s")
    hosts = data.get("hosts")
    if isinstance(hosts, dict):
        extra.add_row("hosts", f"waiting on blocked hosts {hosts['blocked']}, on hosts not yet eligible "
                               f"{hosts['not_eligible']}, on eligible hosts {hosts['eligible']}")
    if data.get("paused"):
        reason = data["paused"]["reason"]
        extra.add_row("paused", f"since {when(data['paused']['since'])}" + (f": {reason}" if reason else "")
                      + " (celery-ha resume)")
    proxies = data.get("proxies")
    if isinstance(proxies, dict) and proxies:
        zones = ("available", "in_use", "new", "temp_banned", "perm_banned")
        extra.add_row("proxies", ", ".join(f"{k}={proxies[k]}" for k in zones if k in proxies))
    outer = Table.grid()
    outer.add_row(table)
    outer.add_row(extra)
    return outer


class RateMeter:
    """Tasks finished per second over a sliding window (smooths the once-a-second samples)."""

    def __init__(self, window: float = 10.0) -> None:
        self.window = window
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, done: int, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window:
            self.samples.popleft()
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0


def _watch(obj: CLIContext, interval: float, updates: int | None) -> None:
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
                        TextColumn("{task.completed}/{task.total}  {task.fields[rate]}"))
    bar = progress.add_task("done", total=1, rate="")
    meter = RateMeter()
    shown = 0
    with Live(console=console(), refresh_per_second=4, transient=False) as live:
        while updates is None or shown < updates:
            try:
                data = snapshot(obj)
            except redis.RedisError as exc:  # a failover or a restart: keep watching, say so
                live.update(Group(progress, Text(f"Redis unreachable ({one_line(mask_url(str(exc)))}); "
                                                 f"retrying every {interval:g}s")))
                shown += 1
                time.sleep(interval)
                continue
            done = int(data.get("completed", 0)) + int(data.get("dead", 0))
            total = done + sum(int(data.get(n, 0)) for n in PENDING)
            rate = meter.add(done)
            left = total - done
            eta = f" eta {left / rate:.0f}s" if rate > 0 and left else ""
            progress.update(bar, completed=done, total=max(total, 1), rate=f"{rate:.1f}/s{eta}")
            live.update(Group(progress, _table(data, rate)))
            shown += 1
            if updates is None or shown < updates:
                time.sleep(interval)  # the refresh period itself, not a wait for a condition


@click.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON snapshot (for scripts and monitoring).")
@click.option("--watch", "-w", is_flag=True, help="Live view: progress bar, rates, counts (Ctrl-C to quit).")
@click.option("--interval", type=FiniteFloatRange(0.1, 3600), default=1.0, show_default=True,
              help="Seconds between refreshes with --watch.")
@click.option("--updates", type=click.IntRange(1), hidden=True, help="Stop --watch after N refreshes.")
@pass_cli
def command(obj: CLIContext, as_json: bool, watch: bool, interval: float, updates: int | None) -> None:
    """Show how many tasks are queued, running, done and dead, plus lifetime counters.

    completed is a lifetime counter; the others are current sizes. --watch adds a progress bar
    (done = completed + dead, out of everything known) and the finishing rate.
    """
    if as_json and watch:
        raise click.UsageError("--json and --watch cannot be combined")
    warn_unknown(obj)
    if watch:
        try:
            _watch(obj, interval, updates)
        except KeyboardInterrupt:
            pass
        return
    data = snapshot(obj)
    if as_json:
        echo_json(data)
        return
    for warning in data["warnings"]:
        click.echo(f"Warning: {warning}", err=True)
    console().print(_table(data))
