"""HTTP validators per task: what a conditional request of the task's page sends next time.

``ctx.fetch`` of a task's own URL sends ``If-None-Match`` / ``If-Modified-Since`` from the ETag or
Last-Modified its previous run got (``fetch/conditional.py``), so a page that did not change costs a
304 and no items. The validators live in one hash per shard (``valid``), keyed by task id: apart from
the task records and the remembered ids, so they survive completion, the trimming of the history and a
recrawl of the same id, and add to a remembered URL only when its site sends validators. The text is
opaque here (``fetch/conditional.py`` makes it: ``e:<etag>`` or ``m:<epoch seconds>``).

Bounded: at most ``limit`` fields per shard (``CELERY_HA_VALIDATORS_MAX``); a new one in a full hash
drops random others (the next fetch of those pages is unconditional, nothing else is lost). Written
only after the task completed (``validators.lua``), never before its items are committed: a run that
fails after its fetch must not leave a validator that turns the next attempt's fetch into a 304.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_ha.base.validation import check_int, check_text

if TYPE_CHECKING:
    from celery_ha.state.taskqueue import TaskQueue

#: Longest validator text kept (characters): a longer ETag is not remembered.
MAX_VALIDATOR_CHARS = 300
#: Default bound of the hash, per shard (``CELERY_HA_VALIDATORS_MAX``).
DEFAULT_LIMIT = 1_000_000


def load_validator(queue: TaskQueue, task_id: str) -> str | None:
    """The validator text remembered for ``task_id``, or None. One HGET."""
    raw = queue.client.hget(queue.shard_keys()[queue._of(task_id)].validators, task_id)
    if raw is None:
        return None
    return raw.decode() if isinstance(raw, bytes) else raw


def store_validator(queue: TaskQueue, task_id: str, text: str | None, unchanged: bool,
                    limit: int = DEFAULT_LIMIT) -> int:
    """Remember ``text`` for ``task_id`` (None: keep what is stored) and, with ``unchanged``, count a
    completion whose page answered 304. Returns how many other validators were dropped for room."""
    check_int("limit", limit, 0, 10**9)
    if text is not None:
        check_text("validator", text, MAX_VALIDATOR_CHARS)
    shard = queue._of(task_id)
    keys = queue.shard_keys()[shard]
    return int(queue._run("validators", task_id, text or "", limit, "1" if unchanged else "0",
                          keys=[keys.validators, keys.stats], shard=shard))
