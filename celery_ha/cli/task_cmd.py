"""``celery-ha task ID``: everything known about one task."""

from __future__ import annotations

from typing import Any

import click

from celery_ha.base.errors import TaskNotFound
from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.render import console, echo_json, kv_table, shown, when
from celery_ha.state import TaskInfo

#: Longest id quoted back in full when it is unknown (real ids have 12 characters; a pasted blob of
#: 100 KB is not echoed back whole).
ID_SHOWN = 64


def task_rows(info: TaskInfo, checkpoint: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """The rows shown for a task (shared with ``dead show``)."""
    return [
        ("id", info.id), ("state", info.state), ("task", info.task), ("url", info.url),
        ("priority", info.priority), ("attempts", f"{info.attempts}/{info.max_attempts}"),
        ("stalls", f"{info.stalls}/{info.max_stalls}"), ("token", info.token), ("worker", info.worker),
        ("error", info.error), ("previous error", info.previous_error),
        ("created", when(info.created_at)), ("updated", when(info.updated_at)), ("due", when(info.due_at)),
        ("dedup", "yes" if info.dedup else "no"), ("meta", info.meta or None), ("checkpoint", checkpoint),
    ]


def show_task(obj: CLIContext, task_id: str, as_json: bool) -> TaskInfo:
    try:
        info = obj.queue.get(task_id)
    except TaskNotFound:
        if len(task_id) <= ID_SHOWN:
            raise
        raise TaskNotFound(f"no task {shown(task_id, ID_SHOWN)!r} ({len(task_id):,} characters) in namespace "
                           f"{obj.namespace!r}") from None
    checkpoint = obj.queue.checkpoint(task_id)
    if as_json:
        echo_json({**info.as_dict(), "checkpoint": checkpoint})
    else:
        console().print(kv_table(task_rows(info, checkpoint), title=f"task {info.id}"))
    return info


@click.command("task")
@click.argument("task_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_cli
def command(obj: CLIContext, task_id: str, as_json: bool) -> None:
    """Show one task: state, URL, attempts, stalls, holder, last error and checkpoint.

    IDs are printed by `enqueue --json`, `dead list` and `workers`. Exits 1 if the id is unknown.
    """
    show_task(obj, task_id, as_json)
