"""``celery-ha workers``: which workers are alive and which tasks each one holds."""

from __future__ import annotations

from typing import Any

import click

from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.known import warn_unknown
from celery_ha.cli.params import FiniteFloatRange
from celery_ha.cli.render import console, echo_json, grid, when
from celery_ha.state.worker_registry import list_workers, running_by_worker, split_worker


def workers_with_leases(obj: CLIContext, max_age: float | None) -> list[dict[str, Any]]:
    """Alive workers from the registry, plus any lease holder missing from it (marked not alive).

    A holder that stopped heart-beating but still holds leases is exactly what an operator needs to
    see: those tasks come back at lease expiry (or at once if its worker reported the death).
    """
    workers = list_workers(obj.client, obj.namespace, max_age=max_age)
    known = {w["name"] for w in workers}
    for name, ids in sorted(running_by_worker(obj.client, obj.namespace).items()):
        if name not in known:
            workers.append({"name": name, "node": split_worker(name)[0], "pid": None,
                            "last_seen": None, "age": None, "tasks": sorted(ids), "alive": False})
    for w in workers:
        w.setdefault("alive", True)
    return workers


@click.command("workers")
@click.option("--max-age", type=FiniteFloatRange(0.1), default=None,
              help="Seconds since the last heartbeat to still count as alive.  [default: lease TTL]")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_cli
def command(obj: CLIContext, max_age: float | None, as_json: bool) -> None:
    """List live worker processes and the task leases each one holds right now."""
    warn_unknown(obj)
    workers = workers_with_leases(obj, max_age)
    if as_json:
        echo_json(workers)
        return
    if not workers:
        click.echo(f"no live workers in namespace {obj.namespace}")
        return
    rows = []
    for w in workers:
        tasks = w["tasks"]
        shown = " ".join(tasks[:4]) + (f" (+{len(tasks) - 4})" if len(tasks) > 4 else "")
        age = "-" if w.get("age") is None else f"{w['age']:.1f}s ago"
        rows.append((w["name"], "yes" if w["alive"] else "NO", age, when(w.get("last_seen")), len(tasks),
                     shown))
    alive = sum(1 for w in workers if w["alive"])
    console().print(grid(("worker", "alive", "heartbeat", "last seen", "leases", "tasks"), rows,
                         title=f"{alive} live worker process(es), namespace {obj.namespace}"))
    reports = {w["node"]: (w.get("patches"), w.get("dispatch"), w.get("broker")) for w in workers
               if w.get("patches")}
    for node, (patches, dispatch, broker) in sorted(reports.items()):
        where = f"; broker {broker}" if broker else ""
        click.echo(f"{node}: patches {patches}; refill dispatch {dispatch}{where}")
