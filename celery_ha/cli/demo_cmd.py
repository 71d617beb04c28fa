"""``celery-ha demo``: the whole system on one machine, with chaos, ending in a verified report."""

from __future__ import annotations

import os
from pathlib import Path

import click

from celery_ha.cli.context import CLIContext, check_namespace_option, pass_cli
from celery_ha.cli.params import FiniteFloatRange


@click.command("demo")
@click.option("--pages", type=click.IntRange(10, 100_000), default=2000, show_default=True,
              help="Detail pages the simulated site lists.")
@click.option("--workers", type=click.IntRange(1, 16), default=2, show_default=True,
              help="Celery worker processes.")
@click.option("--concurrency", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Pool processes per worker.")
@click.option("--chaos/--no-chaos", default=True, show_default=True,
              help="SIGKILL pool children and one whole worker mid-run.")
@click.option("--timeout", type=FiniteFloatRange(10, 3600), default=300, show_default=True,
              help="Give up (exit 1) after this many seconds.")
@click.option("--proxies", type=click.IntRange(1, 200), default=12, show_default=True,
              help="Local forward proxies on 127.0.0.x.")
@click.option("--web/--no-web", default=True, show_default=True,
              help="Serve the live dashboard (celery-ha web) while the demo runs.")
@click.option("--report-json", type=click.Path(dir_okay=False, writable=True, path_type=Path),
              help="Also write the final report as JSON to this file.")
@click.option("--namespace", "-n", callback=check_namespace_option,
              help="Namespace of the demo's crawl (same as the global -n; default: demo).")
@pass_cli
def command(obj: CLIContext, pages: int, workers: int, concurrency: int, chaos: bool, timeout: float,
            proxies: int, web: bool, report_json: Path | None, namespace: str | None) -> None:
    """Crawl a local simulated legal-documents site through a local proxy farm, with chaos.

    Starts the site, the proxies, WORKERS Celery workers and beat as real processes, crawls the
    paginated list and every detail page, kills pool children and a whole worker on the way, and
    verifies against the site that no item was lost or duplicated. Exit 0 only if verified.
    Everything it started is stopped at the end (also on Ctrl-C). Uses the namespace "demo" unless
    --namespace is given (here or before the command), and refuses to touch a namespace it did not
    create.
    """
    from celery_ha.demo.runner import DemoOptions, run_demo

    if report_json is not None:  # checked now: the report must not be lost after a run of minutes
        folder = report_json.parent.resolve()
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise click.BadParameter(f"{str(folder)!r} is not a writable folder", param_hint="--report-json")
    if namespace:
        obj.namespace_option = namespace
    obj.start_embedded = True  # the demo runs on the embedded Redis unless a URL is configured
    ok = run_demo(obj, DemoOptions(pages=pages, workers=workers, concurrency=concurrency, chaos=chaos,
                                   timeout=timeout, proxies=proxies, report_json=report_json,
                                   web=web))
    if not ok:
        raise click.exceptions.Exit(1)
