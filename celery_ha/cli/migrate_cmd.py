"""``celery-ha migrate TARGET --shards N``: move a stopped namespace into a new one of another shard
count (``state/migrate.py`` says what moves and what cannot)."""

from __future__ import annotations

import sys

import click

from celery_ha.cli.context import CLIContext, check_namespace_option, pass_cli
from celery_ha.cli.known import force_option, require_known
from celery_ha.cli.render import echo_json
from celery_ha.state.migrate import Migration, MigrationReport, Progress
from celery_ha.state.shards import MAX_SHARDS


@click.command("migrate")
@click.argument("target", callback=check_namespace_option, metavar="TARGET")
@click.option("--shards", type=click.IntRange(1, MAX_SHARDS), required=True,
              help="The target's shard count (its processes then run with CELERY_HA_SHARDS=N).")
@click.option("--yes", is_flag=True, help="Confirm (required when not asked interactively).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@force_option
@pass_cli
def command(obj: CLIContext, target: str, shards: int, yes: bool, as_json: bool, force: bool) -> None:
    """Move this namespace into the new namespace TARGET, with --shards shards.

    The way to more shards than the namespace was written with. Every task moves with its record
    (attempts, errors, checkpoint, meta); queued ones keep their order, dispatched and running ones
    are queued again (a running one counts a stall). Remembered finished URLs stay duplicates: moved
    as they are, or, where the host gate made their ids depend on the shard count, carried and looked
    up under the ids the source gave them. Settings (URL rules, host limits and blocks,
    schedules, the proxy pool) and the sink's items follow; counters start afresh.

    Stop the namespace's workers, beat and producers first (it refuses while a worker heartbeats or
    a task holds a lease, and exits 1 without finishing when the namespace changed while it was
    read). The source is paused for good and closed: a message still in its broker queue starts no
    task there (the worker drops it, naming TARGET), and `celery-ha resume` refuses it. Its data stays:
    purge it once the target runs well. A migration that stopped half-way is finished by running the
    same command again (once finished, that says so and exits 0). Then start the workers with
    CELERY_HA_NAMESPACE=TARGET and CELERY_HA_SHARDS=N (workers of a matching CELERY_HA_NAMESPACES
    pattern find TARGET by themselves).
    """
    require_known(obj, force)  # the source (-n): the target is new by design
    source, client = obj.namespace, obj.client
    migration = Migration(client, source, target, shards, progress=_progress(as_json))
    if migration.finished():  # the same command again: nothing left to do, and no error
        migration.seal()  # what a release before the claim marks left open
        if as_json:
            echo_json({"source": source, "target": target, "already_migrated": True})
        else:
            click.echo(f"namespace {source} was migrated into {target} already: nothing to do")
        return
    migration.check(obj.settings.lease_ttl)
    if not yes:
        if not sys.stdin.isatty():
            raise click.UsageError(f"refusing to migrate namespace {source!r} without --yes")
        click.confirm(f"Move namespace {source!r} ({len(migration.src)} shard(s)) into {target!r} with "
                      f"{shards} shard(s)? {source!r} is paused and keeps its data", abort=True)
        # The prompt may have waited long: a worker started, or another migration ran, meanwhile.
        migration.check(obj.settings.lease_ttl)
    report = migration.run()  # takes both namespaces atomically: a concurrent one is refused here
    if as_json:
        echo_json(report.as_dict())
    else:
        click.echo(_summary(report))
    if report.unseen:  # not finished: a script that goes on to start the target's workers must stop
        sys.exit(1)


def _progress(quiet: bool) -> Progress:
    def progress(phase: str, done: int) -> None:
        if not quiet:
            click.echo(f"  {phase}: {done:,}", err=True)
    return progress


def _summary(report: MigrationReport) -> str:
    moved = ", ".join(f"{n:,} {state}" for state, n in sorted(report.tasks.items())) or "no task"
    lines = [f"migrated {report.source} ({report.source_shards} shard(s)) into {report.target} "
             f"({report.target_shards} shard(s)): {moved}"]
    if report.unseen:
        lines.append(f"  not finished: {report.source} went through {report.unseen:,} task transition(s) "
                     "while it was read (something still works on it): stop it and run the command again")
    if report.present:
        why = "read again as the source changed, or an earlier run" if report.unseen else "an earlier run"
        lines.append(f"  {report.present:,} task(s) were there already ({why})")
    if report.renamed:
        lines.append(f"  {report.renamed:,} task id(s) changed: the host gate places a task on its "
                     "host's shard")
    lines.append(f"  {report.remembered:,} remembered URL(s), {report.items:,} item(s), "
                 f"{report.checkpoints:,} checkpoint(s), {report.hosts:,} host(s), "
                 f"{report.proxy_keys:,} proxy pool key(s)")
    if report.carried:
        lines.append(f"  {report.carried:,} remembered URL(s) carried: their ids depend on the shard count, "
                     "so an enqueue looks them up under the ids the source gave them")
    if not report.unseen:
        lines.append(f"next: start the workers with CELERY_HA_NAMESPACE={report.target} "
                     f"CELERY_HA_SHARDS={report.target_shards}; purge {report.source} once it runs well")
    return "\n".join(lines)

