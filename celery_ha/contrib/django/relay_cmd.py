"""``manage.py celery_ha relay``: push what the transactional outbox still holds."""

from __future__ import annotations

from typing import NoReturn

import click
from django.db import connections

from celery_ha.base.errors import CeleryHAError
from celery_ha.cli.context import CLIContext, pass_cli
from celery_ha.cli.errors import EXIT_FAILURE, EXIT_UNREACHABLE
from celery_ha.cli.render import echo_json
from celery_ha.contrib.django.outbox import relay
from celery_ha.contrib.django.runtime import runtime


def _alias(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """click callback: ``--database`` must name a database of ``settings.DATABASES`` (a usage error,
    exit 2, instead of Django's ConnectionDoesNotExist deep in the relay)."""
    if value is not None and value not in connections.settings:
        known = ", ".join(sorted(connections.settings)) or "none"
        raise click.BadParameter(f"no database {value!r} in settings.DATABASES (known: {known})")
    return value


@click.command("relay")
@click.option("--database", metavar="ALIAS", callback=_alias,
              help="Relay this database only (default: every database that holds the outbox table).")
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
@pass_cli
def command(obj: CLIContext, database: str | None, as_json: bool) -> None:
    """Push the requests committed but not yet in Redis (Redis was down, or the process died).

    Idempotent: a request pushed twice is queued once. Beat runs the same relay every
    RELAY_INTERVAL seconds. Exits 3 when Redis does not take them, 1 when the configuration is
    refused (e.g. CELERY_HA['SHARDS'] differs from the namespace's); the requests stay either way.
    """
    rt = runtime()
    if obj.redis_url_option and obj.redis_url_option != rt.config.settings.redis_url:
        raise click.UsageError("relay pushes to the project's Redis (CELERY_HA['REDIS_URL']); "
                               "--redis-url cannot point it elsewhere")
    try:
        report = relay(using=database)
    except CeleryHAError as exc:  # no row's fault (bad rows are marked and skipped): the process's
        _fail(f"the relay stopped; the requests not pushed stay in the outbox: {exc}", EXIT_FAILURE)
    if as_json:
        echo_json(report.as_dict())
    else:
        click.echo(f"relayed {report.pushed} request(s) ({report.created} new task(s), "
                   f"{report.pushed - report.created} already queued), {report.left} left in the outbox"
                   + (f", {report.invalid} refused (see their last_error)" if report.invalid else ""))
    if report.error:
        _fail(f"Redis did not take the requests ({report.error}); {report.left} request(s) stay in the "
              "outbox", EXIT_UNREACHABLE)


def _fail(message: str, code: int) -> NoReturn:
    """Stop with one ``Error:`` line and ``code``."""
    error = click.ClickException(message)
    error.exit_code = code
    raise error
