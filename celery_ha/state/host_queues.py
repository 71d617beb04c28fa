"""Reading the host gate's queues from Python: lengths and ids, for listings, metrics and tooling.

A host's queued ids live in one list per band (``hl:<band>:<host>``, band = 1000 - priority), with
the host's bands in ``hb:<host>`` (``_hosts.lua``); a namespace written by an earlier release may
still hold a sorted set ``hq:<host>`` per host, drained first. A list can hold stale entries (ids a
direct claim or a cancel took out of the queue, skipped by the next pop), so a length here counts
entries, and a listing that shows tasks reads their records (as the priority bands' readers do).
"""

from __future__ import annotations

from typing import Any

import redis

from celery_ha.state.keys import QueueKeys


def as_text(value: Any) -> str:
    """A reply of a client without ``decode_responses`` (bytes) or with it (str), as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


#: The band of priority 0 (1000 - priority), where most hosts queue everything.
DEFAULT_BAND = "1000"

#: One part of a host's queue: its key, its entries, and whether it is the earlier release's zset.
Part = tuple[str, int, bool]


def host_queue_parts(client: Any, k: QueueKeys, hosts: list[str]) -> list[list[Part]]:
    """For each host, its queue's parts in hand-out order as :data:`Part`: the earlier release's
    sorted set first when it holds any, then one list per band, best band first. One round trip when
    every host queues at priority 0 only (the band of that priority is read beside the bands), two
    otherwise (``client`` may be a cluster client: each command goes to its key's master)."""
    return _parts(client, k, hosts, False)[0]


def host_states_and_lengths(client: Any, k: QueueKeys, hosts: list[str]) -> list[tuple[dict[str, str], int]]:
    """For each host (all of shard ``k``), its state hash (``h:<host>``) and its queued entries
    (stale list entries included), read in the round trips of :func:`host_queue_parts`."""
    parts, states = _parts(client, k, hosts, True)
    return [(state, sum(n for _, n, _ in own)) for state, own in zip(states, parts, strict=True)]


def _parts(client: Any, k: QueueKeys, hosts: list[str], with_states: bool
           ) -> tuple[list[list[Part]], list[dict[str, str]]]:
    per_host = 4 if with_states else 3
    pipe = client.pipeline(transaction=False)
    for host in hosts:
        pipe.zcard(k.host_queue(host))
        pipe.zrange(k.host_bands(host), 0, -1)
        pipe.llen(k.host_list(DEFAULT_BAND, host))
        if with_states:
            pipe.hgetall(k.host_state(host))
    replies = pipe.execute()
    bands = [[as_text(b) for b in replies[per_host * j + 1]] for j in range(len(hosts))]
    pipe = client.pipeline(transaction=False)
    for host, own in zip(hosts, bands, strict=True):
        for band in own:
            if band != DEFAULT_BAND:
                pipe.llen(k.host_list(band, host))
    lengths = iter(pipe.execute() if any(b != DEFAULT_BAND for own in bands for b in own) else [])
    out: list[list[Part]] = []
    for j, host in enumerate(hosts):
        old = int(replies[per_host * j])
        parts = [(k.host_queue(host), old, True)] if old else []
        parts.extend((k.host_list(band, host), int(replies[per_host * j + 2]) if band == DEFAULT_BAND
                      else int(next(lengths)), False) for band in bands[j])
        out.append(parts)
    states = [replies[per_host * j + 3] for j in range(len(hosts))] if with_states else []
    return out, states


def read_part(client: redis.Redis, part: Part, start: int, stop: int) -> list[str]:
    """Entries ``start``..``stop`` (inclusive) of one part :func:`host_queue_parts` named."""
    key, _, sorted_set = part
    read = client.zrange if sorted_set else client.lrange
    return [as_text(tid) for tid in read(key, start, stop)]


def host_queue_ids(client: redis.Redis, k: QueueKeys, host: str, skip: int = 0, count: int = -1) -> list[str]:
    """Up to ``count`` (-1: every) entries of ``host``'s queue past ``skip``, in hand-out order."""
    out: list[str] = []
    for part in host_queue_parts(client, k, [host])[0]:
        length = part[1]
        if skip >= length:
            skip -= length
            continue
        stop = -1 if count < 0 else skip + count - len(out) - 1
        out.extend(read_part(client, part, skip, stop))
        skip = 0
        if 0 <= count <= len(out):
            break
    return out


def host_queue_heads(client: Any, k: QueueKeys, hosts: list[str], n: int) -> list[str]:
    """The first ``n`` entries of each host's queue (of its first part: the one handed out first), in
    the order of ``hosts``: two or three round trips whatever their number."""
    firsts = [parts[0] for parts in host_queue_parts(client, k, hosts) if parts]
    if not firsts:
        return []
    pipe = client.pipeline(transaction=False)
    for key, _, sorted_set in firsts:
        (pipe.zrange if sorted_set else pipe.lrange)(key, 0, n - 1)
    return [as_text(tid) for ids in pipe.execute() for tid in ids]
