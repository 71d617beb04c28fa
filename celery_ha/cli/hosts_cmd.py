"""``celery-ha hosts list|set|block|unblock|mode|on|off``: see and steer the host gate."""

from __future__ import annotations

import click

from celery_ha.base.hosts import KEY_MODES
from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.known import force_option, require_known, warn_unknown
from celery_ha.cli.params import FiniteFloatRange
from celery_ha.cli.render import console, echo_json, grid, when
from celery_ha.state.hosts import SORTS, UNSET, HostInfo


@click.group("hosts")
def command() -> None:
    """Per-host politeness and fairness: the queue hands out a host's tasks only when the host may
    be fetched (its rate or delay, concurrency, budget, blocks from 429/Retry-After or an operator),
    and serves eligible hosts in turn.

    Settings and blocks act for every worker at once. A host is a host name plus a non-default port
    (as the proxy pool's domains), e.g. example.com or 127.0.0.2:8080; `hosts mode registered-domain`
    puts a site's subdomains behind one gate (example.com for a.example.com and b.example.com).
    """


def _limits(info: HostInfo) -> str:
    parts = []
    if info.rate:
        parts.append(f"rate {info.rate}")
    if info.delay:
        parts.append(f"delay {info.delay:g}s")
    if info.crawl_delay:
        parts.append(f"crawl-delay {info.crawl_delay:g}s")
    if info.concurrency:
        parts.append(f"max {info.concurrency}")
    return ", ".join(parts) or "-"


@command.command("list")
@click.option("--sort", type=click.Choice(SORTS), default="queued", show_default=True,
              help="Order: by count (most first), by host name, by next eligible or blocked-until time.")
@click.option("--limit", type=click.IntRange(1, 10_000_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (every field of every host listed).")
@pass_cli
def list_hosts(obj: CLIContext, sort: str, limit: int, as_json: bool) -> None:
    """List hosts with their queued, running, done and dead tasks, limits, next eligible time,
    block and budget."""
    warn_unknown(obj)
    gate = obj.queue.hosts
    hosts = gate.list(sort=sort)
    shown = hosts[:limit]
    if as_json:
        echo_json({"enabled": gate.enabled(), "mode": gate.mode(), "total": len(hosts),
                   "hosts": [h.as_dict() for h in shown]})
        return
    if not hosts:
        click.echo(f"no hosts in namespace {obj.namespace} (the host gate is "
                   f"{'on' if gate.enabled() else 'off'})")
        return
    rows = [(h.host, h.state, h.queued, h.running, h.done, h.dead, _limits(h),
             "-" if h.budget_left is None else f"{h.budget_left}/{h.budget}", when(h.next_eligible),
             f"{when(h.blocked_until)} ({h.block_reason})" if h.blocked_until else "-")
            for h in shown]
    console().print(grid(("host", "state", "queued", "running", "done", "dead", "limits", "budget left",
                          "next eligible", "blocked until"), rows,
                         title=f"hosts 1-{len(shown)} of {len(hosts)} (by {sort}; key mode {gate.mode()})"))


@command.command("set")
@click.argument("host")
@click.option("--rate", metavar="N/S",
              help="At most N tasks per S seconds, spaced evenly ('none': the default).")
@click.option("--delay", metavar="SECONDS",
              help="Seconds between two tasks of the host ('none': the default).")
@click.option("--concurrency", metavar="K",
              help="Tasks of the host at once, 0 = no limit ('none': the default).")
@click.option("--budget", metavar="N",
              help="Tasks handed out in all, from the host's first ('none': no budget).")
@force_option
@pass_cli
def set_host(obj: CLIContext, host: str, rate: str | None, delay: str | None, concurrency: str | None,
             budget: str | None, force: bool) -> None:
    """Set a host's limits (overrides of the namespace defaults CELERY_HA_HOST_RATE / _DELAY /
    _CONCURRENCY). Switches the namespace's host gate on."""
    if rate is None and delay is None and concurrency is None and budget is None:
        raise click.UsageError("give at least one of --rate, --delay, --concurrency, --budget")

    def value(text: str | None, kind: type) -> object:
        if text is None:
            return UNSET
        if text.strip().lower() in ("none", "default", ""):
            return None
        try:
            return kind(text)
        except ValueError:
            raise click.BadParameter(f"{text!r} is not a {'number' if kind is float else 'whole number'}"
                                     ) from None

    require_known(obj, force)
    obj.queue.hosts.set(host, rate=value(rate, str), delay=value(delay, float),
                        concurrency=value(concurrency, int), budget=value(budget, int))
    info = obj.queue.hosts.get(host)
    budget_text = "-" if info.budget is None else f"{info.budget_left}/{info.budget} left"
    click.echo(f"{info.host}: {_limits(info)}; budget {budget_text}")


@command.command("block")
@click.argument("host")
@click.option("--seconds", type=FiniteFloatRange(0, 30 * 86400), required=True,
              help="How long no task of the host is handed out.")
@click.option("--reason", default="blocked by the operator", show_default=True)
@force_option
@pass_cli
def block(obj: CLIContext, host: str, seconds: float, reason: str, force: bool) -> None:
    """Hold a host back for every worker (its running tasks finish; queued ones wait)."""
    require_known(obj, force)
    until = obj.queue.hosts.block(host, seconds, reason)
    click.echo(f"{obj.queue.hosts.get(host).host} blocked until {when(until)} UTC ({reason})")


@command.command("unblock")
@click.argument("host")
@force_option
@pass_cli
def unblock(obj: CLIContext, host: str, force: bool) -> None:
    """Lift a host's block (and reset its 429 backoff level)."""
    require_known(obj, force)
    obj.queue.hosts.unblock(host)
    click.echo(f"{obj.queue.hosts.get(host).host} unblocked")


@command.command("mode")
@click.argument("mode", required=False, type=click.Choice([*KEY_MODES, "domain"], case_sensitive=False))
@force_option
@pass_cli
def mode(obj: CLIContext, mode: str | None, force: bool) -> None:
    """Show or set how a task gets its host key when its enqueue gives none (host=), for every
    process of the namespace:

    \b
    host               the URL's host plus a non-default port (the default)
    registered-domain  the URL's registered domain (public suffix list): a.example.co.uk and
                       b.example.co.uk share the gate example.co.uk ('domain' for short)
    custom             none: only tasks enqueued with host= are gated, under that key

    Tasks queued before a change keep their keys. Setting a mode switches the host gate on.
    """
    gate = obj.queue.hosts
    if mode is None:
        warn_unknown(obj)
        click.echo(f"host key mode: {gate.mode(fresh=True)} (the host gate is "
                   f"{'on' if gate.enabled() else 'off'})")
        return
    require_known(obj, force)
    click.echo(f"host key mode: {gate.set_mode(mode)} (the host gate is on)")


@command.command("off")
@force_option
@pass_cli
def off(obj: CLIContext, force: bool) -> None:
    """Switch the host gate off: new tasks go to their priority bands, ungated, as without a gate;
    tasks already queued per host still go out under their hosts' limits until drained. (Processes
    started with CELERY_HA_HOSTS=1 or a CELERY_HA_HOST_* default switch it on again: unset those.)"""
    require_known(obj, force)
    obj.queue.hosts.switch(False)
    click.echo(f"host gate of namespace {obj.namespace}: off")


@command.command("on")
@force_option
@pass_cli
def on(obj: CLIContext, force: bool) -> None:
    """Switch the host gate on: new tasks with a host key are queued per host."""
    require_known(obj, force)
    obj.queue.hosts.switch(True)
    click.echo(f"host gate of namespace {obj.namespace}: on")
