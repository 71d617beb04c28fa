"""``python manage.py celery_ha <command> [options]``: the celery-ha CLI under this project's settings.

``manage.py celery_ha stats``, ``… enqueue URL``, ``… task ID``, ``… dead list``, ``… dead redrive
--all``, ``… export``, ``… relay``, ``… --help``: the arguments go to the celery-ha command line as
they are (its own options, exit codes and one-line errors), not through Django's option parser.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from celery_ha.contrib.django import cli
from celery_ha.contrib.django.runtime import current_config


class Command(BaseCommand):
    help = "Run a celery-ha command (stats, enqueue, task, dead, export, relay …) with the project settings."

    def run_from_argv(self, argv: list[str]) -> None:
        """``manage.py celery_ha …`` from a shell: the CLI parses everything after the name."""
        prog = f"{os.path.basename(argv[0])} {argv[1]}"
        sys.exit(cli.run(argv[2:], current_config(), prog))

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER, help="the celery-ha command and its options")

    def handle(self, *args: Any, **options: Any) -> None:
        """``call_command("celery_ha", "stats", "--json")``: a non-zero exit becomes CommandError."""
        code = cli.run(list(args), current_config(), "celery_ha")
        if code:
            raise CommandError(f"celery-ha exited with status {code}", returncode=code)
