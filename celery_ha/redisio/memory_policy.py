"""Is the state Redis allowed to evict keys? Then it can silently drop tasks, checkpoints and items.

With any ``maxmemory-policy`` but ``noeviction``, a Redis that reaches ``maxmemory`` deletes keys to
make room: a namespace's ``tasks`` hash, its checkpoints or its items can vanish, and with them the
guarantees (tasks stuck with no record, outputs lost). ``noeviction`` makes a full Redis refuse
writes instead (a loud error, nothing lost). Workers refuse to start on an evicting Redis unless
``CELERY_HA_ALLOW_EVICTION=1``; beat, ``stats`` and ``redis status`` warn.
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
