"""The running digest of a run's items, stored inside each checkpoint it saves (a reserved field).

``ctx.signature()`` without data signs the items a run emitted (an order-independent sum of their
digests, ``integration/running/context.py``). A run resumed from its checkpoint emits again only the
items after it, so the sum over the items before it must come back with the checkpoint: each
``ctx.save_checkpoint`` stores the sum of every item emitted up to it in the checkpoint's own JSON,
under :data:`ITEMS_SUM` (the same HSET of the same script: no write, key or round trip more; it is
migrated, carried by the claim and dropped at the completion with the checkpoint). A commit without a
checkpoint (``ctx.flush``, every ``FLUSH_AT`` items) leaves it as it is: its items come after the
checkpoint, and a run resumed from that checkpoint emits them again, so they are counted then.

The field is the caller's, never the user's: :func:`take_items_sum` takes it out of a checkpoint read
back (the lease's, ``queue.checkpoint``), so ``ctx.checkpoint`` shows what the task saved.
"""

from __future__ import annotations

from typing import Any

#: The reserved field of a stored checkpoint: the run's items sum so far, 16 hex digits.
ITEMS_SUM = "celery_ha:items_sum"
MOD = 1 << 64


def with_items_sum(text: str, total: int) -> str:
    """The checkpoint JSON object ``text`` (compact, as ``dumps_capped`` wrote it, already checked
    against its cap) with :data:`ITEMS_SUM` set to ``total``: the field first, so a key the checkpoint
    spells the same way (refused by ``ctx.save_checkpoint``) would win when read back."""
    field = f'"{ITEMS_SUM}":"{total % MOD:016x}"'
    return "{" + field + ("}" if text == "{}" else "," + text[1:])


def take_items_sum(checkpoint: dict[str, Any] | None) -> int | None:
    """Remove :data:`ITEMS_SUM` from ``checkpoint`` (read back from Redis, changed in place) and return
    it; None when it carries none (no checkpoint, or one saved by a release before this field)."""
    if not isinstance(checkpoint, dict):
        return None
    raw = checkpoint.pop(ITEMS_SUM, None)
    if not isinstance(raw, str):
        return None
    try:
        return int(raw, 16) % MOD
    except ValueError:
        return None
