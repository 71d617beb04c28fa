"""Is the state Redis allowed to evict keys? Then it can silently drop tasks, checkpoints and items.

With any ``maxmemory-policy`` but ``noeviction``, a Redis that reaches ``maxmemory`` deletes keys to
make room: a namespace's ``tasks`` hash, its checkpoints or its items can vanish, and with them the
guarantees (tasks stuck with no record, outputs lost). ``noeviction`` makes a full Redis refuse
writes instead (a loud error, nothing lost). Workers refuse to start on an evicting Redis unless
``CELERY_HA_ALLOW_EVICTION=1``; beat, ``stats`` and ``redis status`` warn.

One more setting decides how much memory a task takes: task records live in small hashes of 16-32
records (``state/_records.lua``), which Redis keeps as one compact listpack only while every value
fits ``hash-max-listpack-value`` (default 64 bytes; a record with a ~60-character URL is ~100). Below
:data:`RECORD_VALUE_BYTES` a queued task takes ~190 B instead of ~150 B: ``redis status`` says so.
"""

from __future__ import annotations

import redis

SAFE_POLICY = "noeviction"


def eviction_policy(client: redis.Redis) -> str | None:
    """The server's ``maxmemory-policy``, or None when it cannot be read (CONFIG and INFO refused)."""
    try:
        value = client.config_get("maxmemory-policy").get("maxmemory-policy")
        if value:
            return str(value)
    except redis.ResponseError:  # CONFIG is often denied (ACL, managed Redis): INFO says it too
        pass
    try:
        return str(client.info("memory").get("maxmemory_policy") or "") or None
    except redis.ResponseError:
        return None


def eviction_warning(policy: str | None) -> str | None:
    """One line for operators when ``policy`` may evict celery-ha's keys (None when it is safe)."""
    if policy is None or policy == SAFE_POLICY:
        return None
    return (f"the state Redis has maxmemory-policy {policy}: at maxmemory it deletes keys, so tasks, "
            f"checkpoints and items can vanish; set it to {SAFE_POLICY}")


#: The ``hash-max-listpack-value`` that lets task records with URLs up to ~150 characters stay compact.
RECORD_VALUE_BYTES = 256


def listpack_value(client: redis.Redis) -> int | None:
    """The server's ``hash-max-listpack-value`` (``hash-max-ziplist-value`` on 6.2), or None when
    CONFIG is refused."""
    try:
        value = client.config_get("hash-max-ziplist-value").get("hash-max-ziplist-value")
    except redis.ResponseError:
        return None
    return int(value) if value is not None else None


def compact_records_note(value: int | None) -> str | None:
    """One line for operators when task records do not fit a compact bucket (None when they do, or
    when the setting cannot be read)."""
    if value is None or value >= RECORD_VALUE_BYTES:
        return None
    return (f"hash-max-listpack-value is {value}: task records do not fit their compact buckets, so a "
            f"queued task takes ~190 B instead of ~150 B; set it to {RECORD_VALUE_BYTES} (README 'Limits')")
