"""The worker's start-up line: which patches are on, and how refill messages reach the broker.

One INFO line in the worker's main process, after the last patch decided, e.g.::

    celery-ha patches: kombu_fixes, kombu_client_reuse, kombu_lean_acks, quick_reconnect, child_reaper;
    refill dispatch: script push

A patch that is off shows as ``name off (why)`` (and logged its own WARNING when it switched off);
the dispatch path is the script push (the completion's script pushes the refill's messages) or the
Python publish, with why (``integration/dispatch/script_push.py``). The registry also records where
the worker's broker is against the state Redis (``broker_place``), which the CLI reads before it
sends a "start now" message (``cli/pump_hint.py``).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from celery_ha.integration.core.services import served, services
from celery_ha.integration.dispatch.script_push import broker_place, startup_decision
from celery_ha.integration.patches import registry
from celery_ha.state.worker_registry import register_node_info

log = logging.getLogger("celery_ha.patches")


def startup_report(app: Any) -> dict[str, str]:
    """``patches`` and ``dispatch`` (see the module docstring); the dispatch path is decided here
    when not yet."""
    patches = ", ".join(status.line() for status in registry.statuses()) or "none"
    try:
        dispatch = startup_decision(app, services()) if app is not None else "unknown (no app)"
    except Exception as exc:  # say so, and let each pool process decide for itself later
        dispatch = f"not decided yet ({type(exc).__name__}: {exc})"
    report = {"patches": patches, "dispatch": dispatch}
    try:  # for the CLI's "start now" message: sent only to a broker some worker consumes
        report["broker"] = broker_place(app, services()) if app is not None else "unknown"
    except Exception as exc:
        log.debug("could not place the broker: %s", exc)
    return report


def log_startup_line(app: Any) -> None:
    """Log the line, and record the report for ``celery-ha workers`` (worker_registry.py)."""
    report = startup_report(app)
    log.info("celery-ha patches: %s; refill dispatch: %s", report["patches"], report["dispatch"])
    for rt in served():  # `celery-ha workers` of each namespace the worker serves shows it
        register_node_info(rt.client, rt.settings.namespace, rt.node, report)


class StartupReport(bootsteps.StartStopStep):
    """The worker bootstep that logs the line, after the child reaper (the last patch to decide)."""

    requires = ("celery_ha.integration.patches.child_reaper:FastChildReaper",)

    def start(self, worker: object) -> None:
        try:
            log_startup_line(getattr(worker, "app", None))
        except Exception as exc:  # a report, never a reason not to start
            log.warning("celery-ha could not report its patches: %s", exc)
