"""``celery-ha dead list|show|redrive``: inspect and replay the dead-letter set."""

from __future__ import annotations

import click

from celery_ha.base.errors import TaskNotFound
from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.known import force_option, require_known, warn_unknown
from celery_ha.cli.render import console, echo_json, grid, short, shown, when
from celery_ha.cli.task_cmd import ID_SHOWN, show_task


@click.group("dead")
def command() -> None:
    """Tasks that failed max-attempts times or stalled too often (poison pills).

    Look at the reasons with `dead list` / `dead show ID`, fix the cause, then `dead redrive`.
    """


@command.command("list")
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True)
@click.option("--offset", type=click.IntRange(0), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_cli
def list_dead(obj: CLIContext, limit: int, offset: int, as_json: bool) -> None:
    """List dead tasks, oldest death first, with their last error."""
    warn_unknown(obj)
    tasks = obj.queue.dead(limit=limit, offset=offset)
    total = obj.queue.stats()["dead"]
    if as_json:
        echo_json({"total": total, "tasks": [t.as_dict() for t in tasks]})
        return
    if not tasks:
        click.echo(f"no dead tasks in namespace {obj.namespace}")
        return
    rows = [(t.id, t.task, short(t.url, 50), t.attempts, t.stalls, short(t.error, 60), when(t.updated_at))
            for t in tasks]
    console().print(grid(("id", "task", "url", "attempts", "stalls", "error", "died"), rows,
                         title=f"dead tasks {offset + 1}-{offset + len(tasks)} of {total}"))


@command.command("show")
@click.argument("task_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_cli
def show(obj: CLIContext, task_id: str, as_json: bool) -> None:
    """Show one dead task in full (same as `celery-ha task ID`)."""
    info = show_task(obj, task_id, as_json)
    if info.state != "dead" and not as_json:
        click.echo(f"note: task {task_id} is {info.state}, not dead", err=True)


@command.command("redrive")
@click.argument("task_ids", nargs=-1, metavar="[ID]...")
@click.option("--all", "redrive_all", is_flag=True, help="Redrive every dead task.")
@force_option
@pass_cli
def redrive(obj: CLIContext, task_ids: tuple[str, ...], redrive_all: bool, force: bool) -> None:
    """Move dead tasks back to the queue with attempts and stalls reset. Unknown ids are reported and
    the others still redriven (exit 1 if any was unknown)."""
    if redrive_all == bool(task_ids):
        raise click.UsageError("give task IDs or --all (not both)")
    require_known(obj, force)
    if redrive_all:
        click.echo(f"redrove {obj.queue.redrive(None)} task(s)")
        return
    moved, unknown = 0, 0
    for tid in task_ids:  # an unknown id is reported and the others still redriven (exit 1 then)
        try:
            if obj.queue.redrive(tid):
                moved += 1
            else:
                click.echo(f"task {tid} is {obj.queue.get(tid).state}, not dead: skipped", err=True)
        except TaskNotFound:
            unknown += 1
            click.echo(f"Error: no task {shown(tid, ID_SHOWN)!r} in namespace {obj.namespace!r}", err=True)
    click.echo(f"redrove {moved} task(s)" + (f", {unknown} unknown" if unknown else ""))
    if unknown:
        raise click.exceptions.Exit(1)
