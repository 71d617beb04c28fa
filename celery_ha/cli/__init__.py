"""The ``celery-ha`` command line: one click group (:data:`main`) and one small module per command group.

Every command runs inside :class:`~celery_ha.cli.app.CeleryHAGroup`, which turns any expected error
(bad input, unreachable Redis, a missing task) into one masked line on stderr and a non-zero exit code,
so operators and scripts never have to read a traceback.
"""

from celery_ha.cli.app import main

__all__ = ["main"]
