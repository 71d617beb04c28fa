"""``celery-ha purge --yes``: delete every key of one namespace (tasks, items, proxies, stats)."""

from __future__ import annotations

import sys

import click

from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.known import force_option, require_known
from celery_ha.state.purge import purge_namespace


@click.command("purge")
@click.option("--yes", is_flag=True, help="Confirm (required when not asked interactively).")
@force_option
@pass_cli
def command(obj: CLIContext, yes: bool, force: bool) -> None:
    """Delete everything in the namespace: tasks, checkpoints, items, dead letters, proxies, stats.

    Stop workers first, or they recreate keys. Messages already in the Celery broker only carry task
    ids; workers drop them once the tasks are gone.
    """
    require_known(obj, force)  # a typo must not report "purged" while the real namespace stays
    if not yes:
        if not sys.stdin.isatty():
            raise click.UsageError(f"refusing to purge namespace {obj.namespace!r} without --yes")
        click.confirm(f"Delete every key of namespace {obj.namespace!r}?", abort=True)
    count = purge_namespace(obj.client, obj.namespace)
    click.echo(f"purged namespace {obj.namespace}: {count} key(s) deleted")
