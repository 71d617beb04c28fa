"""The ``celery-ha`` click group: global options, one-line errors, and the command registry."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence
from typing import Any

import click

from celery_ha.cli.context import CLIContext, check_namespace_option
from celery_ha.cli.errors import EXIT_USAGE, debug_enabled, describe, one_line, silence_stdout


class CeleryHAGroup(click.Group):
    """A group whose commands never show a traceback: every failure is one masked line on stderr.

    ``invoke`` converts domain and Redis errors (it knows the Redis URL for the message); ``main``
    renders click's own usage errors on one line too, instead of click's usage block.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except KeyboardInterrupt:
            raise click.Abort() from None
        except BrokenPipeError:  # the reader is gone (`celery-ha workers | head`): stop quietly
            silence_stdout()
            raise click.exceptions.Exit(0) from None
        except Exception as exc:
            if debug_enabled():
                traceback.print_exc()
            obj = ctx.find_object(CLIContext)
            message, code = describe(exc, obj.known_url if obj else None)
            error = click.ClickException(message)
            error.exit_code = code
            raise error from None

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # a bare group: show its help, as asked
            click.echo(exc.ctx.get_help() if exc.ctx else exc.format_message())
            sys.exit(EXIT_USAGE)
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
            click.echo(f"Error: {one_line(exc.format_message())}{hint}", err=True)
            sys.exit(exc.exit_code if exc.exit_code else EXIT_USAGE)
        except click.ClickException as exc:
            click.echo(f"Error: {one_line(exc.format_message())}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(130)
        try:  # what is still buffered, now: a reader that went away (`| head`) ends it quietly
            sys.stdout.flush()
        except BrokenPipeError:
            silence_stdout()
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=CeleryHAGroup, context_settings={"help_option_names": ["-h", "--help"],
                                                   "max_content_width": 100})
@click.option("--redis-url", envvar="CELERY_HA_REDIS_URL", show_envvar=True, metavar="URL",
              help="Redis of the state layer (redis://, rediss://, unix://, or sentinel://host:26379;… with "
                   "CELERY_HA_SENTINEL_MASTER). Default: the embedded Redis under .celery-ha/, when it "
                   "runs (demo, up and redis start start it).")
@click.option("--namespace", "-n", envvar="CELERY_HA_NAMESPACE", show_envvar=True,
              callback=check_namespace_option,
              help="Namespace of keys (cha:{NAMESPACE}:*) to work on.  [default: default]")
@click.version_option(package_name="celery-ha", prog_name="celery-ha")
@click.pass_context
def main(ctx: click.Context, redis_url: str | None, namespace: str | None) -> None:
    """celery-ha: high-availability crawl orchestration on Celery.

    Durable tasks, leases, checkpoints and a proxy pool live in Redis; Celery carries task ids.
    With no CELERY_HA_REDIS_URL, commands share one local embedded Redis (persistent, in
    .celery-ha/): `demo`, `up` and `redis start` start it on demand; every other command uses it when
    it runs, else stops with one line (CELERY_HA_EMBEDDED=1 lets any command start it). Start with
    `celery-ha demo`, run with `celery-ha up`.
    """
    ctx.obj = CLIContext(redis_url_option=redis_url or None, namespace_option=namespace or None)


def _register() -> None:
    """Attach the command modules (imported here so each stays a small, independent file)."""
    from celery_ha.cli import (
        control_cmd,
        dead_cmd,
        demo_cmd,
        enqueue_cmd,
        export_cmd,
        hosts_cmd,
        migrate_cmd,
        namespaces_cmd,
        proxies_cmd,
        purge_cmd,
        recrawl_cmd,
        redis_cmd,
        schedules_cmd,
        shards_cmd,
        stats_cmd,
        task_cmd,
        tasks_cmd,
        up_cmd,
        web_cmd,
        workers_cmd,
    )

    for module in (demo_cmd, up_cmd, enqueue_cmd, stats_cmd, task_cmd, tasks_cmd, dead_cmd, proxies_cmd,
                   hosts_cmd, export_cmd, workers_cmd, purge_cmd, recrawl_cmd, schedules_cmd, shards_cmd,
                   migrate_cmd, redis_cmd, web_cmd, namespaces_cmd):
        main.add_command(module.command)
    for command in (control_cmd.cancel, control_cmd.pause_command, control_cmd.resume_command):
        main.add_command(command)


_register()
