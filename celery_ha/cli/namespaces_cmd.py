"""``celery-ha namespaces``: the namespaces this Redis holds (the registry workers of a pattern read)."""

from __future__ import annotations

import click

from celery_ha.base.namespace_lists import matches_namespace_pattern, parse_namespaces
from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.render import console, echo_json, grid
from celery_ha.state.namespaces import register, registered, scan_for_namespaces
from celery_ha.state.sharded import summed_stats
from celery_ha.state.shards import namespace_keys

COLUMNS = ("queued", "running", "delayed", "dead", "completed")


@click.command("namespaces")
@click.argument("pattern", required=False, default="*")
@click.option("--scan", is_flag=True,
              help="First find namespaces by scanning the keyspace (one SCAN pass, O(keys)) and register "
                   "them: for namespaces written by releases before the registry.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one object per namespace).")
@pass_cli
def command(obj: CLIContext, pattern: str, scan: bool, as_json: bool) -> None:
    """List the registered namespaces matching PATTERN (default '*'), with their task counts.

    A namespace is registered at its first enqueue; workers, beat and `celery-ha web` of a pattern
    (CELERY_HA_NAMESPACES=crawl-*) serve the registered namespaces it matches. `purge` unregisters.
    """
    try:
        patterns = parse_namespaces("PATTERN", pattern)
    except Exception as exc:
        raise click.BadParameter(str(exc), param_hint="PATTERN") from None
    client = obj.client
    if scan:
        found = scan_for_namespaces(client)
        new = sorted(set(found) - set(registered(client)))
        register(client, *new)
        click.echo(f"scanned: {len(found)} namespace(s) hold keys, {len(new)} newly registered"
                   + (f" ({', '.join(new)})" if new else ""), err=as_json)
    names = [n for n in registered(client) if matches_namespace_pattern(n, patterns)]
    rows = []
    for name in names:
        stats = summed_stats(client, namespace_keys(client, name))
        rows.append({"namespace": name, **{c: int(stats.get(c, 0)) for c in COLUMNS}})
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo(f"no registered namespace matches {pattern!r}" + ("" if scan else " (try --scan)"))
        return
    console().print(grid(("namespace", *COLUMNS), [tuple(r.values()) for r in rows],
                         title=f"{len(rows)} namespace(s) matching {pattern}"))
