"""``manage.py celery_ha relay``: push what the transactional outbox still holds."""

from __future__ import annotations

import click

from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.errors import EXIT_UNREACHABLE
from celery_ha.cli.render import echo_json
from celery_ha.contrib.django.outbox import relay
from celery_ha.contrib.django.runtime import runtime


@click.command("relay")
@click.option("--database", metavar="ALIAS", help="Relay this database only (default: every database "
              "that holds the outbox table).")
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
@pass_cli
def command(obj: CLIContext, database: str | None, as_json: bool) -> None:
    """Push the requests committed but not yet in Redis (Redis was down, or the process died).

    Idempotent: a request pushed twice is queued once. Beat runs the same relay every
    RELAY_INTERVAL seconds. Exits 3 when Redis does not take them (the requests stay).
    """
    rt = runtime()
    if obj.redis_url_option and obj.redis_url_option != rt.config.settings.redis_url:
        raise click.UsageError("relay pushes to the project's Redis (CELERY_HA['REDIS_URL']); "
                               "--redis-url cannot point it elsewhere")
    report = relay(using=database)
    if as_json:
        echo_json(report.as_dict())
    else:
        click.echo(f"relayed {report.pushed} request(s) ({report.created} new task(s), "
                   f"{report.pushed - report.created} already queued), {report.left} left in the outbox"
                   + (f", {report.invalid} refused (see their last_error)" if report.invalid else ""))
    if report.error:
        error = click.ClickException(f"Redis did not take the requests ({report.error}); {report.left} "
                                     "request(s) stay in the outbox")
        error.exit_code = EXIT_UNREACHABLE
        raise error
