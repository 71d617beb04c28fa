"""What a namespace's settings are, copied by a migration (``state/migrate.py``) before its tasks:
the meta hash's settings (URL rules, the quiet window), the host gate's switch, key mode and
defaults on every target shard, each host's limits, blocks and counters on its host's shard (not
its work in flight: those tasks are queued again), refetch schedules on every shard, and the proxy
pool's keys with their expiry (DUMP/RESTORE). Writes that meet a key the target holds overwrite
settings (the source's are the truth) and leave proxy keys as they are."""

from __future__ import annotations

import redis

from celery_ha.state.keys import QueueKeys
from celery_ha.state.shards import shard_of

PAGE = 500  # hosts read per round trip
#: hcfg fields that are the gate's bookkeeping, not settings (_hosts.lua's header).
HCFG_BOOKKEEPING = ("nq", "lrs", "hl", "lq", "seq", "rf")
#: A host's fields that count work in flight in the source (the target starts with none; its budget
#: used, ``u``, leaves them out too: they are queued again and counted when handed out again).
HOST_IN_FLIGHT = ("a", "d", "lr")
#: The meta fields that are settings of the namespace (the rest is bookkeeping of its processes).
META_SETTINGS = ("urlrules", "quiet_from", "quiet_to")


def copy_settings(client: redis.Redis, source: str, target: str, src: list[QueueKeys],
                  dst: list[QueueKeys]) -> tuple[int, int]:
    """Copy ``source``'s settings into ``target``; returns (hosts, proxy keys) copied."""
    src0 = src[0]
    meta = dict(zip(META_SETTINGS, client.hmget(src0.meta, list(META_SETTINGS)), strict=True))
    meta = {name: value for name, value in meta.items() if value is not None}
    if meta:
        client.hset(QueueKeys(target).meta, mapping=meta)
    hcfg = {f: v for f, v in client.hgetall(src0.host_config).items() if f not in HCFG_BOOKKEEPING}
    schedules = client.hgetall(src0.schedules)
    for k in dst:
        if hcfg:
            client.hset(k.host_config, mapping=hcfg)
        if schedules:
            client.hset(k.schedules, mapping=schedules)
    hosts = sum(_copy_hosts(client, k, dst) for k in src)
    return hosts, _copy_proxy_keys(client, source, target)


def _copy_hosts(client: redis.Redis, k: QueueKeys, dst: list[QueueKeys]) -> int:
    hosts = sorted(client.sscan_iter(k.hosts, count=1000))
    for at in range(0, len(hosts), PAGE):
        chunk = hosts[at:at + PAGE]
        pipe = client.pipeline(transaction=False)
        for host in chunk:
            pipe.hgetall(k.host_state(host))
        states = pipe.execute()
        pipe = client.pipeline(transaction=False)
        for host, state in zip(chunk, states, strict=True):
            dk = dst[shard_of(host, len(dst))]
            kept = {f: v for f, v in state.items() if f not in HOST_IN_FLIGHT}
            if "u" in kept:  # its in-flight tasks are queued again: counted when handed out again
                kept["u"] = str(max(0, int(kept["u"]) - int(state.get("a") or 0)))
            if kept:
                pipe.hset(dk.host_state(host), mapping=kept)
            pipe.sadd(dk.hosts, host)
        pipe.execute()
    return len(hosts)


def _copy_proxy_keys(client: redis.Redis, source: str, target: str) -> int:
    """Copy the proxy pool's keys (``cha:{source}:px:*``) with DUMP/RESTORE, expiry kept; a key the
    target holds already is left as it is. Returns how many were copied."""
    old, new = QueueKeys(source).prefix + "px:", QueueKeys(target).prefix + "px:"
    copied = 0
    for key in client.scan_iter(match=old + "*", count=1000):
        blob, ttl = client.dump(key), client.pttl(key)
        if blob is None or ttl == -2:
            continue
        try:
            client.restore(new + key[len(old):], max(ttl, 0), blob)
        except redis.ResponseError as exc:
            if "BUSYKEY" not in str(exc):
                raise
            continue
        copied += 1
    return copied
