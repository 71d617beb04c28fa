"""``celery-ha recrawl``: queue completed tasks again, by id or by URL pattern and age."""

from __future__ import annotations

from collections import Counter

import click

from celery_ha.base.errors import InvalidInput
from celery_ha.base.validation import parse_duration
from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.known import force_option, require_known, warn_unknown
from celery_ha.cli.pump_hint import kick
from celery_ha.cli.render import echo_json
from celery_ha.state.enqueue_args import SCRIPT_BATCH
from celery_ha.state.listing import completed_matching


def _age(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            parse_duration(value, "age")
        except InvalidInput as exc:
            raise click.BadParameter(str(exc)) from None
    return value


@click.command("recrawl")
@click.argument("task_ids", nargs=-1, metavar="[ID]...")
@click.option("--match", "pattern", metavar="GLOB",
              help="Completed tasks whose URL matches GLOB ('*' any text, '?' one character), e.g. "
                   "'https://shop.example/category/*'.")
@click.option("--older-than", callback=_age, metavar="AGE",
              help="Completed tasks that finished at least AGE ago: 90s, 15m, 6h, 7d, 2w.")
@click.option("--task", help="Only tasks of this durable task name.")
@click.option("--all", "every", is_flag=True, help="Every known completed task (the history, and those "
                                                   "waiting for a scheduled refetch).")
@click.option("--due", is_flag=True, help="The scheduled refetches whose time came (what the sweep "
                                          "queues; see `celery-ha schedules`).")
@click.option("--dry-run", is_flag=True, help="Only say how many would be queued again.")
@click.option("--pump/--no-pump", default=True, show_default=True,
              help="Ask a live worker to dispatch them now (else the next sweep does).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@force_option
@pass_cli
def command(obj: CLIContext, task_ids: tuple[str, ...], pattern: str | None, older_than: str | None,
            task: str | None, every: bool, due: bool, dry_run: bool, pump: bool, as_json: bool,
            force: bool) -> None:
    """Queue completed tasks again: each starts a new run (same URL, meta and task; attempts cleared).

    Name tasks by id, or select them with --match, --older-than and --task (together: all must
    hold), or --all, from the completed history and every task waiting for a scheduled refetch;
    --due queues the scheduled refetches whose time came. Tasks that are queued, running, delayed or
    dead are left alone. The history holds the latest completions only (history_max, 10,000 by
    default, for a day): to refetch URLs whatever their age, give their task or host a schedule
    (`celery-ha schedules set`), or enqueue them again with `enqueue --recrawl-after AGE`.
    """
    selecting = pattern is not None or older_than is not None or task is not None
    if due and (task_ids or selecting or every):
        raise click.UsageError("--due takes no ids and no other selection")
    if task_ids and (selecting or every):
        raise click.UsageError("give task ids, or select with --match/--older-than/--task/--all, not both")
    if not task_ids and not (selecting or every or due):
        raise click.UsageError("name the tasks: IDs, --match GLOB, --older-than AGE, --task NAME, --all "
                               "or --due")
    if dry_run:
        warn_unknown(obj)  # a dry run only reads
    else:
        require_known(obj, force)
    if due:
        _due(obj, dry_run, pump, as_json)
        return
    ids = list(task_ids) or completed_matching(obj.queue, match=pattern, older_than=older_than, task=task)
    if dry_run:
        would = sum(1 for info in obj.queue.get_many(ids) if info is not None and info.state == "completed")
        if as_json:
            echo_json({"namespace": obj.namespace, "would_queue": would, "dry_run": True})
        else:
            click.echo(f"would queue {would} completed task(s) again (namespace {obj.namespace})")
        return
    results = obj.queue.recrawl(ids)
    counts = Counter(results.values())
    queued = counts.get("queued", 0)
    kicked = bool(queued and pump and kick(obj))
    if as_json:
        echo_json({"namespace": obj.namespace, "queued": queued,
                   "not_completed": counts.get("not completed", 0), "unknown": counts.get("unknown", 0),
                   "pumped": kicked, **({"results": results} if task_ids else {})})
    else:
        if task_ids:
            for task_id, result in results.items():
                click.echo(f"{task_id}: {result}")
        click.echo(f"queued {queued} completed task(s) again, {counts.get('not completed', 0)} not "
                   f"completed (left alone), {counts.get('unknown', 0)} unknown (namespace {obj.namespace})")
    if task_ids and counts.get("unknown"):
        raise click.exceptions.Exit(1)


def _due(obj: CLIContext, dry_run: bool, pump: bool, as_json: bool) -> None:
    """``--due``: queue every scheduled refetch whose time came now (the sweep does it too)."""
    if dry_run:
        would = obj.queue.refetch_pending()["due"]
        if as_json:
            echo_json({"namespace": obj.namespace, "would_queue": would, "dry_run": True})
        else:
            click.echo(f"would queue {would} due scheduled refetch(es) (namespace {obj.namespace})")
        return
    queued = obj.queue.refetch_due(limit=SCRIPT_BATCH, max_calls=1_000_000)  # short calls (README)
    kicked = bool(queued and pump and kick(obj))
    if as_json:
        echo_json({"namespace": obj.namespace, "queued": queued, "pumped": kicked})
    else:
        click.echo(f"queued {queued} due scheduled refetch(es) (namespace {obj.namespace})")
