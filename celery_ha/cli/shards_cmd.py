"""``celery-ha shards``: where each shard of a namespace lives (hash tag, slot, master) and what it
holds; ``celery-ha shards move``: move one shard to another master of a Redis Cluster."""

from __future__ import annotations

import sys

import click

from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.known import force_option, require_known, warn_unknown
from celery_ha.cli.render import console, echo_json, grid
from celery_ha.redisio.cluster import is_cluster_client
from celery_ha.redisio.slot_move import keys_of_slot, master_at, move_slot
from celery_ha.state.keys import prefix
from celery_ha.state.shards import shard_table
from celery_ha.state.worker_registry import list_workers


@click.group("shards", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one object per shard).")
@click.pass_context
def command(ctx: click.Context, as_json: bool) -> None:
    """List the namespace's shards: hash tag, Redis Cluster slot, the master serving it, and its tasks.

    The count is the one the namespace was written with (CELERY_HA_SHARDS when it was first used).
    On a Redis Cluster each shard is one slot: this shows which master holds it ("keys": every key
    of the slot there), and `shards move` moves one to another master (README, "Growing a sharded
    namespace"). On a single Redis there is no master column.
    """
    if ctx.invoked_subcommand is not None:
        return
    obj: CLIContext = ctx.obj
    warn_unknown(obj)
    table = shard_table(obj.client, obj.namespace)
    if as_json:
        echo_json([info.as_dict() for info in table])
        return
    cluster = table[0].node is not None
    headers = ("shard", "hash tag", "slot", *(("master", "keys") if cluster else ()), "records", "queued",
               "running", "delayed", "dead", "remembered")
    rows = [(i.index, i.tag, i.slot, *((i.node, i.keys_in_slot) if cluster else ()), i.records, i.queued,
             i.running, i.delayed, i.dead, i.remembered) for i in table]
    masters = len({i.node for i in table}) if cluster else 1
    where = f"on {masters} master(s) of the cluster" if cluster else "on one Redis"
    console().print(grid(headers, rows, title=f"namespace {obj.namespace}: {len(table)} shard(s) {where}"))


@command.command("move")
@click.argument("shard", type=click.IntRange(0))
@click.option("--to", "to", required=True, metavar="HOST:PORT",
              help="The master that takes the shard (add a new one first: redis-cli --cluster add-node).")
@click.option("--yes", is_flag=True, help="Confirm (required when not asked interactively).")
@force_option
@pass_cli
def move(obj: CLIContext, shard: int, to: str, yes: bool, force: bool) -> None:
    """Move SHARD (its slot and every key of it) to the master at HOST:PORT.

    Offline: stop the namespace's workers, beat and everything that enqueues into it first (the
    command refuses while a worker heartbeats or a task runs; it cannot see other producers). A
    move that stopped half-way is finished by running the same command again.
    """
    client = obj.client
    if not is_cluster_client(client):
        raise click.ClickException("shards move needs a Redis Cluster (--redis-url redis+cluster://...): "
                                   "on a single Redis every shard is on the one server")
    require_known(obj, force)
    table = shard_table(client, obj.namespace)
    if shard >= len(table):
        raise click.ClickException(
            f"namespace {obj.namespace!r} has {len(table)} shard(s): 0..{len(table) - 1}")
    info = table[shard]
    target = master_at(client, to)
    if info.node == f"{target.host}:{target.port}":
        click.echo(f"shard {shard} (slot {info.slot}) is on {to} already")
        return
    live = list_workers(client, obj.namespace, max_age=obj.settings.lease_ttl)
    running = sum(i.running for i in table)
    if live or running:
        raise click.ClickException(
            f"stop the namespace's workers and beat first: {len(live)} live worker process(es), {running} "
            "running task(s) (scripts must not run on a slot while it moves)")
    own = prefix(obj.namespace, info.tag)
    foreign = [k for k in keys_of_slot(client, info.slot) if not k.startswith(own)]
    if foreign:
        raise click.ClickException(
            f"slot {info.slot} also holds {len(foreign)} key(s) of other hash tags (e.g. {foreign[0]!r}): "
            "moving it would move them too; move it with redis-cli once their users are stopped")
    if not yes:
        if not sys.stdin.isatty():
            raise click.UsageError(f"refusing to move shard {shard} without --yes")
        click.confirm(f"Move shard {shard} of {obj.namespace!r} (slot {info.slot}, {info.keys_in_slot} "
                      f"key(s)) from {info.node} to {to}? Nothing may enqueue into the namespace meanwhile",
                      abort=True)

    def progress(moved: int) -> None:
        click.echo(f"  {moved:,} of {info.keys_in_slot:,} key(s) moved", err=True)

    moved = move_slot(client, info.slot, target, progress)
    click.echo(f"moved shard {shard} of {obj.namespace} (slot {info.slot}, {moved} key(s)) from {info.node} "
               f"to {target.host}:{target.port}")
