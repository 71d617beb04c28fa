"""``celery-ha cancel`` / ``pause`` / ``resume``: stop a task, or the whole namespace's dispatching."""

from __future__ import annotations

import click

from celery_ha.base.errors import TaskNotFound
from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.known import force_option, require_known
from celery_ha.cli.pump_hint import kick
from celery_ha.cli.render import echo_json
from celery_ha.state.pause import pause, resume


@click.command("cancel")
@click.argument("task_ids", nargs=-1, required=True, metavar="ID...")
@click.option("--reason", default="by the operator", show_default=True, help="Recorded as its error.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@force_option
@pass_cli
def cancel(obj: CLIContext, task_ids: tuple[str, ...], reason: str, as_json: bool, force: bool) -> None:
    """Cancel tasks: each ends dead with the error "cancelled: REASON".

    A queued, delayed or dispatched task never runs; a running one stops at its next checkpoint or
    fenced write (nothing it does afterwards is stored). `celery-ha dead redrive ID` brings one back.
    Unknown ids are reported and the others still cancelled (exit 1 if any was unknown).
    """
    require_known(obj, force)
    results: dict[str, str] = {}
    for task_id in task_ids:
        try:
            left = obj.queue.cancel(task_id, reason)
        except TaskNotFound:
            results[task_id] = "unknown"
            continue
        results[task_id] = f"cancelled (was {left})" if left else "already finished"
    if as_json:
        echo_json({"namespace": obj.namespace, "results": results})
    else:
        for task_id, result in results.items():
            click.echo(f"{task_id}: {result}")
    if "unknown" in results.values():
        raise click.exceptions.Exit(1)


@click.command("pause")
@click.option("--reason", default="", help="Shown by `celery-ha stats`.")
@force_option
@pass_cli
def pause_command(obj: CLIContext, reason: str, force: bool) -> None:
    """Stop dispatching new tasks in this namespace (running tasks finish; nothing is lost).

    Every pump sees the pause within one heartbeat interval (CELERY_HA_HEARTBEAT_INTERVAL). Enqueueing
    still works; `celery-ha resume` restarts dispatching.
    """
    require_known(obj, force)  # a typo must not pause a namespace nobody uses (the real one runs on)
    if pause(obj.client, obj.namespace, reason):
        click.echo(f"namespace {obj.namespace} paused: no new task is dispatched until `celery-ha resume`")
    else:
        click.echo(f"namespace {obj.namespace} was already paused")


@click.command("resume")
@force_option
@pass_cli
def resume_command(obj: CLIContext, force: bool) -> None:
    """Dispatch again after `celery-ha pause` (workers refill their window within seconds).

    Refused (exit 1) for a namespace `celery-ha migrate` moved away or is moving: its tasks run in the
    new namespace. After a migration abandoned by purging its target, it resumes the old namespace.
    """
    require_known(obj, force)
    if resume(obj.client, obj.namespace):
        kick(obj)
        click.echo(f"namespace {obj.namespace} resumed")
    else:
        click.echo(f"namespace {obj.namespace} was not paused")
