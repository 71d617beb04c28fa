"""``celery-ha proxies add|import|list|ban|unban|remove|check``: operate the shared proxy pool."""

from __future__ import annotations

from typing import IO

import click

from celery_ha.base.errors import InvalidInput
from celery_ha.base.masking import mask_url
from celery_ha.base.settings import Settings
from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.known import warn_unknown
from celery_ha.cli.params import FiniteFloatRange
from celery_ha.cli.render import console, echo_json, grid, read_lines, stream_name, when

STATES = ("avail", "new", "tban", "pban")


@click.group("proxies")
def command() -> None:
    """The proxy pool every worker borrows from (scores, per-domain locks and rate windows, bans).

    Proxies are URLs like http://user:pass@host:port; they are shown by id (host:port) with the
    password masked.
    """


def _source_option(f):  # type: ignore[no-untyped-def]
    return click.option("--source", default="static", show_default=True,
                        help="Label of where the proxies came from (static, tunnel, api, free...).")(f)


def _add_options(f):  # type: ignore[no-untyped-def]
    f = click.option("--ttl", type=FiniteFloatRange(min=1), help="Lifetime at the provider, seconds.")(f)
    f = click.option("--verify", is_flag=True,
                     help="Keep out of rotation until a health check passes (free lists).")(f)
    return _source_option(f)


def _report(result: dict[str, int], as_json: bool) -> None:
    if as_json:
        echo_json(result)
    else:
        click.echo(f"added {result.get('added', 0)}, updated {result.get('updated', 0)}, "
                   f"skipped {result.get('skipped', 0)} prox{'y' if result.get('added') == 1 else 'ies'}")


@command.command("add")
@click.argument("urls", nargs=-1, required=True, metavar="URL...")
@_add_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_cli
def add(obj: CLIContext, urls: tuple[str, ...], source: str, ttl: float | None, verify: bool,
        as_json: bool) -> None:
    """Add proxies (http://[user:pass@]host:port). All are checked first: one bad URL adds none."""
    _report(obj.pool.add_many(urls, source=source, ttl=ttl, verify=verify), as_json)


@command.command("import")
@click.argument("file", type=click.File("rb"))
@_add_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_cli
def import_(obj: CLIContext, file: IO[bytes], source: str, ttl: float | None, verify: bool,
            as_json: bool) -> None:
    """Add proxies from FILE, one URL per line ('-' = stdin; blank lines and # comments skipped)."""
    name = stream_name(file)
    lines = read_lines(file, name)
    if not lines:
        raise click.UsageError(f"no proxy URLs in {name}")
    from celery_ha.proxy import parse_proxy_url

    for number, text in lines:
        try:
            parse_proxy_url(text)
        except InvalidInput as exc:
            raise InvalidInput(f"{name} line {number}: {exc}") from None
    _report(obj.pool.add_many([t for _, t in lines], source=source, ttl=ttl, verify=verify), as_json)


@command.command("list")
@click.option("--state", type=click.Choice(STATES), help="Only proxies in this state.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_cli
def list_(obj: CLIContext, state: str | None, as_json: bool) -> None:
    """List proxies, best score first: state, score, success rate, latency, bans."""
    warn_unknown(obj)
    infos = obj.pool.list(state)
    if as_json:
        echo_json([i.to_dict() for i in infos])
        return
    if not infos:
        click.echo(f"no proxies in namespace {obj.namespace}" + (f" with state {state}" if state else ""))
        return
    rows = [(i.id, mask_url(i.url), i.state, i.source, f"{i.score:.3f}", f"{i.success:.0%}",
             "-" if i.latency_ms < 0 else f"{i.latency_ms} ms", i.ok, i.blocked, i.transport_errors,
             when(i.ban_until_ms / 1000) if i.ban_until_ms else "-", i.ban_reason)
            for i in infos]
    console().print(grid(("id", "url", "state", "source", "score", "success", "latency", "ok", "blocked",
                          "errors", "banned until", "reason"), rows, title=f"{len(infos)} proxies"))


@command.command("ban")
@click.argument("proxy", metavar="ID|URL")
@click.option("--seconds", type=FiniteFloatRange(min=1), help="Temporary ban; omit for a permanent ban.")
@click.option("--reason", default="manual", show_default=True)
@pass_cli
def ban(obj: CLIContext, proxy: str, seconds: float | None, reason: str) -> None:
    """Take a proxy out of rotation, for --seconds or for good."""
    state = obj.pool.ban(proxy, seconds, reason)
    how = "permanently" if seconds is None else f"for {seconds:g}s"
    click.echo(f"{mask_url(proxy)}: banned {how} ({state})")


@command.command("unban")
@click.argument("proxy", metavar="ID|URL")
@pass_cli
def unban(obj: CLIContext, proxy: str) -> None:
    """Put a proxy back in rotation, clearing its bans and failure counts."""
    score = obj.pool.unban(proxy)
    if score is None:
        click.echo(f"{mask_url(proxy)}: ban lifted (it left the pool: its provider may add it again)")
    else:
        click.echo(f"{mask_url(proxy)}: available again (score {score:.3f})")


@command.command("remove")
@click.argument("proxy", metavar="ID|URL")
@pass_cli
def remove(obj: CLIContext, proxy: str) -> None:
    """Forget a proxy entirely."""
    if not obj.pool.remove(proxy):
        raise InvalidInput(f"unknown proxy {mask_url(proxy)!r}")
    click.echo(f"{mask_url(proxy)}: removed")


@command.command("check")
@click.option("--url", "check_url", default=lambda: Settings.one("proxy_check_url") or None,
              metavar="URL", help="Page to fetch through each proxy (env CELERY_HA_PROXY_CHECK_URL).")
@click.option("--limit", type=click.IntRange(1, 100_000), default=200, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 256), default=8, show_default=True)
@click.option("--timeout", type=FiniteFloatRange(0.1, 300), default=5.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_cli
def check(obj: CLIContext, check_url: str | None, limit: int, concurrency: int, timeout: float,
          as_json: bool) -> None:
    """Health-check the proxies that are due (new ones, expired temporary bans) now.

    A pass restores a proxy to rotation; a failure bans it again with a longer backoff. Beat runs the
    same check periodically; this is the manual trigger.
    """
    if not check_url:
        raise click.UsageError("give --url URL (or set CELERY_HA_PROXY_CHECK_URL)")
    from celery_ha.proxy import check_proxies

    report = check_proxies(obj.pool, check_url, concurrency=concurrency, timeout=timeout, limit=limit)
    if as_json:
        echo_json(report.to_dict())
        return
    click.echo(f"checked {report.checked}, restored {len(report.restored)}, demoted {len(report.demoted)}")
    for pid, state in sorted(report.demoted.items()):
        click.echo(f"  {pid}: {state}")
