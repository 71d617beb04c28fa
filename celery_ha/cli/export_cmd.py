"""``celery-ha export``: write the result sink out as JSON Lines."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import click

from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.state.sink import iter_items


@click.command("export")
@click.option("--format", "fmt", type=click.Choice(["jsonl"]), default="jsonl", show_default=True,
              help="Output format (JSON Lines: one item per line).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True, allow_dash=True), default="-",
              show_default=True, help="File to write ('-' = stdout). Written atomically.")
@pass_cli
def command(obj: CLIContext, fmt: str, output: str) -> None:
    """Export every item the crawl emitted (each exactly once), in commit order."""
    del fmt  # one format today; the option is the stable interface for more
    if output == "-":
        count = 0
        for item in iter_items(obj.client, obj.namespace):
            sys.stdout.write(json.dumps(item, ensure_ascii=False) + "\n")
            count += 1
        sys.stdout.flush()
        click.echo(f"exported {count} item(s)", err=True)
        return
    target = Path(output)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent.resolve())
    count = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for item in iter_items(obj.client, obj.namespace):
                out.write(json.dumps(item, ensure_ascii=False) + "\n")
                count += 1
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    click.echo(f"exported {count} item(s) to {target}", err=True)
