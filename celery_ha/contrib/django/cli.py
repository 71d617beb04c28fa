"""``manage.py celery_ha <command> …``: the celery-ha command line under the project's settings.

The click CLI and every process it starts (``up`` runs workers and beat) read the environment, so the
project's ``CELERY_HA`` values are put there first, under their variable names, without replacing a
variable already set (the environment wins, as everywhere). The group gains ``relay``, which needs
the project's database. ``up``'s workers and beat also import ``celery_ha.contrib.django.tasks``:
beat then relays the outbox every ``RELAY_INTERVAL`` seconds.
"""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Sequence

import click

from celery_ha.base.settings import Settings
from celery_ha.cli.app import main
from celery_ha.contrib.django import relay_cmd
from celery_ha.contrib.django.conf import DjangoConfig

#: The task module that runs the relay in Celery (workers and beat of ``up``).
TASKS_MODULE = "celery_ha.contrib.django.tasks"


def export_config(config: DjangoConfig) -> None:
    """Put the project's celery-ha values into this process's environment (a variable already set
    stays), and ``TASKS_MODULE`` first in the worker's extra imports."""
    for var, text in config.variables.items():
        os.environ.setdefault(var, text)
    var = Settings().env_names()["extra_imports"]
    modules = [m.strip() for m in Settings.one("extra_imports").split(",") if m.strip()]
    if TASKS_MODULE not in modules:
        os.environ[var] = ",".join([TASKS_MODULE, *modules])


def group() -> click.Group:
    """The ``celery-ha`` group plus ``relay`` (a copy: the shared group stays as it is)."""
    cli = copy.copy(main)
    cli.commands = {**main.commands, relay_cmd.command.name or "relay": relay_cmd.command}
    cli.help = inspect.cleandoc(main.help or "") + ("\n\nUnder Django: `relay` pushes the transactional "
                                                      "outbox to Redis.")
    return cli


def run(args: Sequence[str], config: DjangoConfig, prog_name: str) -> int:
    """Run the CLI with ``args``; returns its exit code (0 = success)."""
    export_config(config)
    try:
        group().main(args=list(args), prog_name=prog_name, standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0
