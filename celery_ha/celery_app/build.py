"""Build the celery-ha Celery app: settings from ``celeryconfig``, then every hook installed once."""

from __future__ import annotations

import os
import sys

from celery import Celery

from celery_ha.base.errors import ConfigurationError
from celery_ha.integration import kombu_client_reuse, kombu_fixes
from celery_ha.integration.hooks import WorkerHooks


def _under_celery_cli() -> bool:
    return os.path.basename(sys.argv[0] if sys.argv else "") in ("celery", "celery.exe") or \
        "celery.__main__" in sys.modules


def build_app() -> Celery:
    """The app, configured from ``celeryconfig`` (validated now: a bad knob fails here, with one line
    under the ``celery`` command instead of a traceback), with :class:`WorkerHooks` installed and
    kombu's Redis transport fixed (``integration/kombu_fixes.py``) and reusing its clients
    (``integration/kombu_client_reuse.py``)."""
    kombu_fixes.install()
    kombu_client_reuse.install()
    app = Celery("celery_ha")
    try:
        import celeryconfig
    except ConfigurationError as exc:
        if _under_celery_cli():
            print(f"celery-ha: configuration error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        raise
    app.config_from_object(celeryconfig)
    WorkerHooks(app).install()
    return app
