"""Batches (``CELERY_HA_BATCH``): one Celery message carries several durable task ids.

Celery's own cost per message (about three broker round trips, three task events and a hand-off to
the pool) dominates tiny tasks. A batch pays it once for up to N ids; the pool child runs them one
by one, each claimed, fenced, renewed, checkpointed and completed on its own, and refills the window
once, with the last id (in its completion's script, or a pump). A completion claims the next id in
the same script (``complete_claim.lua``), so each task of a batch costs one script, not two. Nothing
of a batch is stranded:

* the ids a child did not reach when it stopped (SIGTERM of a graceful shutdown), or when the
  message's soft time limit came between two ids (``graceful_stop``), are sent again at once in a
  new message, before the child returns;
* when a child dies (SIGKILL, OOM), the worker's main process releases the one it was running (fast
  failover) and re-sends the ids still waiting for their claim (``on_child_lost``);
* every id stays ``dispatched`` until its claim, so the redispatch timeout covers anything else.

A claim Redis cannot take (an outage) puts the whole message back in the broker; the ids already
finished are then dropped by their claims.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from celery_ha.integration.core.services import services
from celery_ha.integration.core.task_spec import DurableTask
from celery_ha.integration.dispatch.pump import pump_quietly, resend_waiting
from celery_ha.integration.running.graceful_stop import stop_handler
from celery_ha.integration.running.runner import Outcome, release_unstarted, run_message
from celery_ha.state import Lease

log = logging.getLogger(__name__)


def run_batch(spec: DurableTask, celery_task: Any, task_ids: list[str]) -> list[Outcome]:
    """Run the ids of one message in order; hand the rest on at once if asked to stop."""
    outcomes: list[Outcome] = []
    stop = stop_handler()
    rt = services()
    last = len(task_ids) - 1
    claimed: Lease | None = None  # the next id's lease, taken by the previous completion's script
    with stop.holding_lease():  # a SIGTERM between two ids is noted too: the rest is handed on below
        for position, task_id in enumerate(task_ids):
            if stop.stop_requested or stop.soft_limit:  # a shutdown, or the message's soft time limit
                if claimed is not None:  # claimed, not started: back to queued before it is re-sent
                    release_unstarted(rt, claimed)
                left = task_ids[position:]
                sent = resend_waiting(celery_task.app, rt, left)
                why = "its soft time limit" if stop.soft_limit and not stop.stop_requested else "a shutdown"
                log.warning("batch stopped before %d task(s) (%s): %d sent again", len(left), why, sent)
                pump_quietly(celery_task.app, rt)
                break
            # The last id refills the window (in its completion's script when it completes); every
            # other id's completion claims the next id in the same script.
            outcome = run_message(spec, celery_task, task_id, refill=position == last, lease=claimed,
                                  then_claim=None if position == last else task_ids[position + 1])
            claimed = outcome.next_lease
            outcomes.append(outcome)
            if position == last and outcome.kind == "dropped":
                pump_quietly(celery_task.app, rt)  # a dropped id refills nothing; the batch still does
    return outcomes


def summary(outcomes: list[Outcome], total: int) -> str:
    """The Celery result of a batch message: how many ids ended how."""
    counts = Counter(o.kind for o in outcomes)
    parts = [f"{n} {kind}" for kind, n in sorted(counts.items())]
    if len(outcomes) < total:
        parts.append(f"{total - len(outcomes)} handed on")
    return f"batch of {total}: " + ", ".join(parts)
