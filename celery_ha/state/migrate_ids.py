"""Which id a task takes when its namespace moves to another shard count (``state/migrate.py``).

A task's record sits on the shard of its id. Most tasks keep their id. A gated task (a host key)
must sit on its host's shard, whose index depends on the count, and a dedup task's id must be the
one an enqueue into the target computes for its URL, or dedup would miss it. So a gated dedup task
whose id the source's enqueue derived from its URL takes the first of the digests of
(task, URL, n), n = 0, 1, ..., that lands on its host's shard (``enqueue_args.on_host_shard``, the
target's own rule), and another gated task off its host's shard takes digests of its old id. A
dedup task without a host key (queued while the gate was off) may sit anywhere, but takes the id a
gated target's enqueue gives its URL. No task takes an id another task keeps: the next candidate.
Every choice is a digest, never a random draw, so a second run of a migration gives the same ids.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterator

import redis

from celery_ha.base.errors import InvalidInput
from celery_ha.base.hosts import host_of_url, mode_key
from celery_ha.base.urls import UrlRules, canonical_url, simple_canonical_url
from celery_ha.state.enqueue_args import on_host_shard
from celery_ha.state.ids import dedup_id, encode_id
from celery_ha.state.keys import QueueKeys
from celery_ha.state.record_store import read_records
from celery_ha.state.records import TaskInfo
from celery_ha.state.sharded import by_shard
from celery_ha.state.shards import shard_of


def places_by_host(gate_on: bool, shards: int) -> bool:
    """Whether a namespace picks a gated task's id by its host's shard (enqueue_args.build_row)."""
    return gate_on and shards > 1


class TargetIds:
    """The ids of one migration's tasks in the target (see the module docstring)."""

    def __init__(self, client: redis.Redis, src: list[QueueKeys], target_shards: int, rules: UrlRules,
                 key_mode: str, gate_ever: bool) -> None:
        self.client, self.src, self.count = client, src, target_shards
        self.rules, self.src_mode = rules, key_mode
        self.src_by_host = places_by_host(gate_ever, len(src))
        self.dst_by_host = places_by_host(gate_ever, target_shards)

    def url_key(self, info: TaskInfo) -> str:
        """The gate key the source's enqueue made from a task's URL (its key mode; '' for none)."""
        try:
            return mode_key(host_of_url(info.url), self.src_mode)
        except InvalidInput:
            return ""

    def candidates(self, old: str, info: TaskInfo, key: str) -> Iterator[str]:
        """The ids a source task may take in the target, best first (:meth:`new_id` takes the first
        one where it must sit that no other task keeps). A dedup task whose id the source's enqueue
        made from its URL (``key``: the gate key it was placed by, or '') gets the one the target's
        enqueue makes: the first of the digests of (task, URL, n), n = 0, 1, ..., on the key's
        shard (``enqueue_args.on_host_shard``; the plain digest where nothing places it), so dedup
        stays exact. Any other task keeps its id, or, gated and off its host's shard, takes digests
        of the old id (not random draws: a second run gives the same id)."""
        if info.dedup and key:
            canonical = simple_canonical_url(info.url) or canonical_url(info.url, self.rules)
            derived = dedup_id(info.task, canonical)
            if old == derived or (len(self.src) > 1 and on_host_shard(
                    derived, key, True, info.task, canonical, len(self.src)) == old):
                yield derived
                for n in itertools.count(1):
                    yield dedup_id(info.task, f"{canonical}\0{n}")
        yield old
        for n in itertools.count(1):
            yield encode_id(hashlib.sha256(f"migrate\0{old}\0{n}".encode()).digest())

    def new_id(self, old: str, info: TaskInfo, taken: Callable[[str], bool] = lambda _tid: False) -> str:
        """The id of a source task in the target. A gated task (a host key) must sit on its host's
        shard. A dedup task without one (queued while the gate was off) may sit anywhere, but takes
        the id a gated target's enqueue gives its URL, so dedup finds it. ``taken``: whether another
        task keeps (or was given) an id."""
        count = self.count
        key = info.host or (self.url_key(info) if info.dedup and (self.src_by_host or self.dst_by_host)
                            else "")
        if not key:
            return old
        place = info.host or (key if self.dst_by_host else "")
        want = shard_of(place, count) if place and count > 1 else None
        for tid in self.candidates(old, info, key):
            if (want is None or shard_of(tid, count) == want) and (tid == old or not taken(tid)):
                return tid
        raise AssertionError("unreachable: the candidates never end")

    def taken(self, ids: list[str]) -> set[str]:
        """Which of ``ids`` a source task keeps as its own id in the target (a renamed task must not
        land there; an id whose holder is renamed away is free)."""
        found: set[str] = set()
        for shard, positions in by_shard(ids, len(self.src)).items():
            part = [ids[p] for p in positions]
            records = read_records(self.client, self.src[shard], part)
            found.update(t for t, raw in zip(part, records, strict=True)
                         if raw is not None and self.new_id(t, TaskInfo.parse(t, raw)) == t)
        return found
