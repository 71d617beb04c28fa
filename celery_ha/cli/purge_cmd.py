"""``celery-ha purge --yes``: delete every key of one namespace (tasks, items, proxies, stats)."""

from __future__ import annotations

import sys

import click
import redis

from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.state.keys import prefix


def purge_namespace(client: redis.Redis, namespace: str, batch: int = 500) -> int:
    """SCAN + UNLINK every ``cha:{namespace}:*`` key in batches; returns how many were deleted.

    Not one Lua script on purpose: a big namespace would block Redis for seconds; batches keep
    every other client served. Glob characters cannot occur in a namespace (validated), so the
    pattern matches this namespace only.
    """
    pattern = prefix(namespace) + "*"
    deleted = 0
    pending: list[str] = []
    for key in client.scan_iter(match=pattern, count=batch):
        pending.append(key)
        if len(pending) >= batch:
            deleted += int(client.unlink(*pending))
            pending.clear()
    if pending:
        deleted += int(client.unlink(*pending))
    return deleted


@click.command("purge")
@click.option("--yes", is_flag=True, help="Confirm (required when not asked interactively).")
@pass_cli
def command(obj: CLIContext, yes: bool) -> None:
    """Delete everything in the namespace: tasks, checkpoints, items, dead letters, proxies, stats.

    Stop workers first, or they recreate keys. Messages already in the Celery broker only carry task
    ids; workers drop them once the tasks are gone.
    """
    if not yes:
        if not sys.stdin.isatty():
            raise click.UsageError(f"refusing to purge namespace {obj.namespace!r} without --yes")
        click.confirm(f"Delete every key of namespace {obj.namespace!r}?", abort=True)
    count = purge_namespace(obj.client, obj.namespace)
    click.echo(f"purged namespace {obj.namespace}: {count} key(s) deleted")
