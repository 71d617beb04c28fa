"""``celery-ha tasks``: list the tasks in one state (queued, running, delayed, completed, dead …)."""

from __future__ import annotations

import click

from celery_ha.base.validation import check_task_name
from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.known import warn_unknown
from celery_ha.cli.render import console, echo_json, grid, short, when
from celery_ha.state.listing import MAX_LIMIT, STATES, list_tasks


def _task_name(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            check_task_name(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


@click.command("tasks")
@click.option("--state", type=click.Choice(STATES), default="queued", show_default=True,
              help="Which tasks to list.")
@click.option("--task", "task_name", callback=_task_name, help="Only tasks of this task name.")
@click.option("--limit", type=click.IntRange(1, MAX_LIMIT), default=50, show_default=True)
@click.option("--offset", type=click.IntRange(0), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one object with the tasks).")
@pass_cli
def command(obj: CLIContext, state: str, task_name: str | None, limit: int, offset: int,
            as_json: bool) -> None:
    """List the tasks in one state, in that state's order.

    queued: claim order (priority, then age); dispatched: oldest message first; running: soonest
    lease expiry first; delayed: soonest retry first; completed: the bounded history, oldest first;
    dead: oldest death first. `celery-ha task ID` shows one in full.
    """
    warn_unknown(obj)
    tasks = list_tasks(obj.queue, state, task=task_name, limit=limit, offset=offset)
    total = obj.queue.stats()[state]
    if as_json:
        echo_json({"state": state, "task": task_name, "offset": offset,
                   "total_in_state": total, "tasks": [t.as_dict() for t in tasks]})
        return
    if not tasks:
        which = f" of task {task_name}" if task_name else ""
        click.echo(f"no {state} tasks{which} in namespace {obj.namespace} (offset {offset})")
        return
    rows = [(t.id, t.task, short(t.url, 50), t.priority, t.attempts, t.stalls, short(t.error, 40),
             when(t.updated_at)) for t in tasks]
    title = f"{state} tasks {offset + 1}-{offset + len(tasks)} of {total}"
    if task_name:
        title = f"{state} tasks of {task_name}, {offset + 1}-{offset + len(tasks)} ({total} {state} in all)"
    console().print(grid(("id", "task", "url", "priority", "attempts", "stalls", "error", "updated"), rows,
                         title=title))
