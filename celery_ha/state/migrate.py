"""Move a namespace into a new one, of another shard count (``celery-ha migrate``).

A namespace keeps the shard count it was first written with (``state/shards.py``): a task's shard is
a function of its id and the count, so changing the count in place would hide tasks in shards no
process reads. Growing past the pre-sharded count therefore goes through a new namespace, and this
module moves everything a crawl needs into it, with the source stopped:

* **Every task record**, as stored: attempts, stalls, errors, fencing token, dedup flag, meta, trace,
  refetch state. Queued tasks first, band by band and host queue by host queue in hand-out order,
  then every other record (``migrate_in.lua`` files each by its state: a dispatched one is queued, a
  running one counts a stall). Checkpoints follow their tasks. A record that changed state between
  the two passes is counted (``unseen``) and taken by a second run.
* **Ids** stay the same, except for gated tasks (``Migration.candidates``): one must sit on its host's
  shard, so a gated dedup task gets the id an enqueue into the target gives its URL, and another
  gated task off its host's shard a digest of its old id; never the id of another source record.
* **Remembered finished URLs** (ids only, no URL) move as they are when their ids do not depend on
  the count (neither side places gated tasks by host, or the count is unchanged). Otherwise they are
  carried (``state/carried.py``): kept under ``cd:`` and looked up by the target's enqueue under the
  id the source gave the URL, so they stay duplicates. Ids the source carries from its own
  ancestors are carried on.
* **Settings**: URL rules, the quiet window, the host gate's defaults, key mode and switch, each
  host's limits, blocks and counters (not its in-flight counts), refetch schedules, and the proxy
  pool's keys (with their expiry).
* **Sink items** in commit order, each in the target shard of its item key.

Not moved: counters and histograms (the target starts its own), ETag validators (a cache),
the worker registry. Idempotent: every write skips what the target holds already, so a migration
that stopped half-way (killed, Redis gone) is finished by running it again. The target remembers
its source (meta ``migrating_from``, then ``migrated_from``), and refuses another source.
"""

from __future__ import annotations

import hashlib
import itertools
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import redis
from redis.client import NEVER_DECODE

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.urls import DEFAULT_RULES, canonical_url, simple_canonical_url
from celery_ha.state.carried import Carry, set_carries, stored_carries
from celery_ha.state.done_times import DONE_EPOCH_MS, HOUR_MS, done_id
from celery_ha.state.enqueue_args import on_host_shard
from celery_ha.state.host_queues import as_text, host_queue_parts, read_part
from celery_ha.state.ids import dedup_id, encode_id
from celery_ha.state.keys import QueueKeys
from celery_ha.state.pause import pause
from celery_ha.state.record_store import all_records, read_records, record_count
from celery_ha.state.records import TaskInfo
from celery_ha.state.sharded import by_shard
from celery_ha.state.shards import namespace_keys, shard_of
from celery_ha.state.taskqueue import TaskQueue
from celery_ha.state.url_rules import stored_rules
from celery_ha.state.worker_registry import list_workers

PAGE = 500  # records read from the source per round trip
BATCH = 200  # rows per migrate_in call: each call stays short (other clients wait behind it)
#: hcfg fields that are the gate's bookkeeping, not settings (_hosts.lua's header).
HCFG_BOOKKEEPING = ("nq", "lrs", "hl", "lq", "seq")
#: A host's fields that count work in flight in the source (the target starts with none; its budget
#: used, ``u``, leaves them out too: they are queued again and counted when handed out again).
HOST_IN_FLIGHT = ("a", "d", "lr")
#: The meta fields that are settings of the namespace (the rest is bookkeeping of its processes).
META_SETTINGS = ("urlrules", "quiet_from", "quiet_to")

Progress = Callable[[str, int], None]


@dataclass
class MigrationReport:
    """What a migration moved (``celery-ha migrate`` prints it)."""

    source: str
    target: str
    source_shards: int
    target_shards: int
    tasks: dict[str, int] = field(default_factory=dict)  # moved now, by their state in the source
    present: int = 0  # records the target held already (a run that finishes an earlier one)
    unseen: int = 0  # source records neither pass saw (they changed state meanwhile): run it again
    renamed: int = 0  # tasks whose id changed (the host gate places them on their host's shard)
    checkpoints: int = 0
    remembered: int = 0  # finished dedup ids the target remembers from this run
    carried: int = 0  # remembered ids whose meaning depends on the count, carried (state/carried.py)
    items: int = 0
    hosts: int = 0
    proxy_keys: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def places_by_host(gate_on: bool, shards: int) -> bool:
    """Whether a namespace picks a gated task's id by its host's shard (enqueue_args.build_row)."""
    return gate_on and shards > 1


class Migration:
    """One migration of ``source`` into ``target`` with ``shards`` shards (see the module docstring)."""

    def __init__(self, client: redis.Redis, source: str, target: str, shards: int,
                 progress: Progress | None = None) -> None:
        if source == target:
            raise ConfigurationError(f"the target namespace must differ from the source ({source!r})")
        self.client = client
        self.source, self.target = source, target
        self.src = namespace_keys(client, source)
        self.queue = TaskQueue(client, target, shards=shards)
        self.dst = self.queue.shard_keys()
        self.progress = progress or (lambda _phase, _n: None)
        self.report = MigrationReport(source, target, len(self.src), shards)
        # Whether the gate was ever on ('0' once switched off): its tasks' ids may depend on the count.
        gate = client.hget(self.src[0].host_config, "on") in ("0", "1")
        self.src_by_host = places_by_host(gate, len(self.src))
        self.dst_by_host = places_by_host(gate, shards)
        self.rules = stored_rules(client, source) or DEFAULT_RULES

    # ------------------------------------------------------------------ checks
    def check(self, lease_ttl: float) -> None:
        """Refuse (ConfigurationError, nothing written) a source with live workers, an empty one, or
        a target that holds anything but an earlier run of this same migration."""
        live = list_workers(self.client, self.source, max_age=lease_ttl)
        if live:
            raise ConfigurationError(
                f"stop the workers of {self.source!r} first: {len(live)} worker process(es) heartbeat "
                f"within the lease ({lease_ttl:g} s); a task they hold would run in both namespaces")
        tmeta = QueueKeys(self.target).meta
        running, done = self.client.hmget(tmeta, ["migrating_from", "migrated_from"])
        if done is not None:
            raise ConfigurationError(f"namespace {self.target!r} was migrated from {done!r} already")
        origin = running
        if origin is not None and origin != self.source:
            raise ConfigurationError(
                f"namespace {self.target!r} was migrated from {origin!r}, not {self.source!r}")
        if origin is None and self._holds_anything(namespace_keys(self.client, self.target)):
            raise ConfigurationError(
                f"namespace {self.target!r} is not empty: migrate into a new namespace (or purge it first)")
        if not self._holds_anything(self.src):
            raise ConfigurationError(f"namespace {self.source!r} holds no tasks, remembered URLs or items")

    def _holds_anything(self, shards: list[QueueKeys]) -> bool:
        pipe = self.client.pipeline(transaction=False)
        for k in shards:
            pipe.hlen(k.tasks)
            pipe.hget(k.record_geometry, "n")
            pipe.hget(k.stats, "remembered")
            pipe.hlen(k.items)
            pipe.scard(k.legacy_seen)
        return any(int(v or 0) for v in pipe.execute())

    # ------------------------------------------------------------------ the run
    def run(self) -> MigrationReport:
        """Pause the source, copy settings, tasks, remembered ids and items; mark both namespaces."""
        client, tmeta = self.client, QueueKeys(self.target).meta
        pause(client, self.source, reason=f"migrated to {self.target}")
        client.hsetnx(tmeta, "migrating_from", self.source)
        self.queue._ensure_layout()  # records the target's shard count (an empty namespace takes any)
        self._settings()
        for index, k in enumerate(self.src):
            # The queued records in hand-out order first, then every other record. A record that
            # changed state between the two passes (something ran against the source meanwhile), or
            # a queued record in no queue, is seen by neither: counted, and taken by a second run.
            seen = self._import(self._queued_records(k), k)
            seen += self._import(((tid, raw) for tid, raw in all_records(client, k)
                                  if TaskInfo.parse(tid, raw).state != "queued"), k)
            self.report.unseen += max(0, record_count(client, k) - seen)
            self.progress(f"tasks of shard {index}", sum(self.report.tasks.values()))
        self._remembered()
        self._items()
        client.hset(tmeta, "migrated_from", self.source)
        client.hdel(tmeta, "migrating_from")
        client.hset(QueueKeys(self.source).meta, "migrated_to", self.target)
        return self.report

    # ------------------------------------------------------------------ settings
    def _settings(self) -> None:
        client, src0 = self.client, self.src[0]
        meta = dict(zip(META_SETTINGS, client.hmget(src0.meta, list(META_SETTINGS)), strict=True))
        meta = {name: value for name, value in meta.items() if value is not None}
        if meta:
            client.hset(QueueKeys(self.target).meta, mapping=meta)
        hcfg = {f: v for f, v in client.hgetall(src0.host_config).items() if f not in HCFG_BOOKKEEPING}
        schedules = client.hgetall(src0.schedules)
        for k in self.dst:
            if hcfg:
                client.hset(k.host_config, mapping=hcfg)
            if schedules:
                client.hset(k.schedules, mapping=schedules)
        for k in self.src:
            hosts = sorted(client.sscan_iter(k.hosts, count=1000))
            for at in range(0, len(hosts), PAGE):
                chunk = hosts[at:at + PAGE]
                pipe = client.pipeline(transaction=False)
                for host in chunk:
                    pipe.hgetall(k.host_state(host))
                states = pipe.execute()
                pipe = client.pipeline(transaction=False)
                for host, state in zip(chunk, states, strict=True):
                    dk = self.dst[shard_of(host, len(self.dst))]
                    kept = {f: v for f, v in state.items() if f not in HOST_IN_FLIGHT}
                    if "u" in kept:  # its in-flight tasks are queued again: counted when handed out again
                        kept["u"] = str(max(0, int(kept["u"]) - int(state.get("a") or 0)))
                    if kept:
                        pipe.hset(dk.host_state(host), mapping=kept)
                    pipe.sadd(dk.hosts, host)
                pipe.execute()
                self.report.hosts += len(chunk)
        self._proxy_keys()

    def _proxy_keys(self) -> None:
        """Copy the proxy pool's keys (``cha:{source}:px:*``) with DUMP/RESTORE, expiry kept; a key
        the target holds already is left as it is."""
        client = self.client
        old, new = QueueKeys(self.source).prefix + "px:", QueueKeys(self.target).prefix + "px:"
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
            self.report.proxy_keys += 1

    # ------------------------------------------------------------------ tasks
    def _queued_records(self, k: QueueKeys) -> Iterator[tuple[str, str]]:
        """The source shard's queued records in hand-out order: the ready bands, best first, then
        each host's queue (stale entries, whose records are not queued there, are skipped)."""
        client = self.client
        for band in client.zrange(k.ready_bands, 0, -1):
            key = k.ready_list(band)
            start = 0
            while page := [as_text(i) for i in client.lrange(key, start, start + PAGE - 1)]:
                start += len(page)
                for tid, raw in zip(page, read_records(client, k, page), strict=True):
                    if raw is not None and self._queued_in(raw, band, None):
                        yield tid, raw
        for host in sorted(client.sscan_iter(k.hosts, count=1000)):
            for part in host_queue_parts(client, k, [host])[0]:
                for start in range(0, part[1], PAGE):
                    page = read_part(client, part, start, start + PAGE - 1)
                    for tid, raw in zip(page, read_records(client, k, page), strict=True):
                        if raw is not None and self._queued_in(raw, None, host):
                            yield tid, raw

    @staticmethod
    def _queued_in(raw: str, band: str | None, host: str | None) -> bool:
        info = TaskInfo.parse("", raw)
        if info.state != "queued" or info.host != host:
            return False
        return band is None or str(info.priority) == str(band)

    def candidates(self, old: str, info: TaskInfo) -> Iterator[str]:
        """The ids a source task may take in the target, best first (:meth:`new_id` takes the first
        on the right shard that no other source record holds). A gated dedup task whose id the
        source's enqueue made from its URL gets the one the target's enqueue makes: the first of the
        digests of (task, URL, n), n = 0, 1, ..., on its host's shard (``enqueue_args.on_host_shard``;
        the plain digest on one shard), so dedup stays exact. Any other task keeps its id, or, gated
        and off its host's shard, takes digests of the old id (not random draws: a second run, and
        the second pass over the records, give the same id)."""
        if info.host and info.dedup:
            canonical = simple_canonical_url(info.url) or canonical_url(info.url, self.rules)
            derived = dedup_id(info.task, canonical)
            if old == derived or (len(self.src) > 1 and on_host_shard(
                    derived, info.host, True, info.task, canonical, len(self.src)) == old):
                yield derived
                for n in itertools.count(1):
                    yield dedup_id(info.task, f"{canonical}\0{n}")
        yield old
        for n in itertools.count(1):
            yield encode_id(hashlib.sha256(f"migrate\0{old}\0{n}".encode()).digest())

    def new_id(self, old: str, info: TaskInfo, taken: Callable[[str], bool] = lambda _tid: False) -> str:
        """The id of a source task in the target: a task without a host keeps its id (it may sit on
        any shard); a gated one takes the first of its :meth:`candidates` on its host's shard that
        no other source record holds (``taken``)."""
        if not info.host:
            return old
        count = len(self.dst)
        want = shard_of(info.host, count)
        for tid in self.candidates(old, info):
            if (count == 1 or shard_of(tid, count) == want) and (tid == old or not taken(tid)):
                return tid
        raise AssertionError("unreachable: the candidates never end")

    def _taken(self, ids: list[str]) -> set[str]:
        """Which of ``ids`` are ids of source records (a renamed task must not land on one)."""
        found: set[str] = set()
        for shard, positions in by_shard(ids, len(self.src)).items():
            part = [ids[p] for p in positions]
            records = read_records(self.client, self.src[shard], part)
            found.update(t for t, raw in zip(part, records, strict=True) if raw is not None)
        return found

    def _import(self, records: Iterable[tuple[str, str]], k: QueueKeys) -> int:
        """Take ``records`` of source shard ``k`` in; returns how many it went through."""
        page: list[tuple[str, str]] = []
        count = 0
        for pair in records:
            page.append(pair)
            count += 1
            if len(page) >= PAGE:
                self._import_page(page, k)
                page = []
        if page:
            self._import_page(page, k)
        return count

    def _import_page(self, page: list[tuple[str, str]], k: QueueKeys) -> None:
        client = self.client
        old_ids = [tid for tid, _ in page]
        pipe = client.pipeline(transaction=False)
        pipe.hmget(k.checkpoints, old_ids)
        pipe.zmscore(k.refetch, old_ids)
        pipe.zmscore(k.completed, old_ids)
        checkpoints, refetch, history = pipe.execute()
        infos = [TaskInfo.parse(old, raw) for old, raw in page]
        news = [self.new_id(old, info) for old, info in zip(old_ids, infos, strict=True)]
        moved = [j for j, (old, new) in enumerate(zip(old_ids, news, strict=True)) if new != old]
        if moved:  # the rare renamed id that another source record holds: the next candidate
            clash = self._taken([news[j] for j in moved])
            for j in moved:
                if news[j] in clash:
                    news[j] = self.new_id(old_ids[j], infos[j], lambda tid: bool(self._taken([tid])))
        groups: dict[int, list[tuple[str, list[str], TaskInfo]]] = {}
        for (old, raw), new, info, ckpt, due, at in zip(page, news, infos, checkpoints, refetch, history,
                                                         strict=True):
            row = [new, raw, ckpt or "", "" if due is None else f"{due:.0f}",
                   "" if at is None else f"{at:.0f}"]
            groups.setdefault(shard_of(new, len(self.dst)), []).append((old, row, info))
        for shard, rows in groups.items():
            for at in range(0, len(rows), BATCH):
                chunk = rows[at:at + BATCH]
                reply = as_text(self.queue._run("migrate_in", "r", *(v for _, row, _ in chunk for v in row),
                                                shard=shard))
                for (old, row, info), code in zip(chunk, reply, strict=True):
                    if code == "0":
                        self.report.present += 1
                        continue
                    state = str(getattr(info.state, "value", info.state))
                    self.report.tasks[state] = self.report.tasks.get(state, 0) + 1
                    self.report.remembered += code == "R"  # a finished dedup task, remembered now
                    self.report.renamed += row[0] != old
                    self.report.checkpoints += bool(row[2])

    # ------------------------------------------------------------------ remembered ids
    def remembered_moves(self) -> bool:
        """Whether remembered ids keep their meaning in the target (see the module docstring)."""
        same = len(self.src) == len(self.dst) and self.src_by_host == self.dst_by_host
        return same or not (self.src_by_host or self.dst_by_host)

    def _remembered(self) -> None:
        """Remembered ids move as they are when they keep their meaning; otherwise they are carried
        (``state/carried.py``), as are the ids the source itself carries from its own ancestors."""
        moves = self.remembered_moves()
        carries = stored_carries(self.client, self.source)
        if not moves:
            carries.append(Carry(len(self.src), self.src_by_host))
        for k in self.src:
            self._send("m" if moves else "c", self._bucket_ids(k, "d:"))
            self._send("c", self._bucket_ids(k, "cd:"))
        set_carries(self.client, self.target, carries)

    def _send(self, mode: str, ids: Iterable[tuple[str, str]]) -> None:
        """Take (id, hour) pairs into the target's shards by id, as remembered ('m') or carried ('c')."""
        rows: dict[int, list[str]] = {}
        pending = 0
        for tid, hour in ids:
            rows.setdefault(shard_of(tid, len(self.dst)), []).extend((tid, hour))
            pending += 1
            if pending >= PAGE:
                self._flush(mode, rows)
                pending = 0
        self._flush(mode, rows)

    def _flush(self, mode: str, rows: dict[int, list[str]]) -> None:
        for shard, flat in rows.items():
            for at in range(0, len(flat), 2 * BATCH):
                taken = as_text(self.queue._run("migrate_in", mode, *flat[at:at + 2 * BATCH], shard=shard))
                if mode == "m":
                    self.report.remembered += taken.count("1")
                else:
                    self.report.carried += taken.count("1")
        rows.clear()
        self.progress("remembered URLs", self.report.remembered + self.report.carried)

    def _bucket_ids(self, k: QueueKeys, family: str) -> Iterator[tuple[str, str]]:
        """(id, completion hour) of every id in one family of buckets of the source shard: ``d:``
        (remembered) or ``cd:`` (carried), whose fields are binary (read undecoded); with ``d:``, then
        the sorted set of earlier releases (ms -> hour)."""
        client = self.client
        keys = [as_text(key) for key in client.scan_iter(match=k.prefix + family + "*", count=1000)]
        for at in range(0, len(keys), 100):
            chunk = keys[at:at + 100]
            pipe = client.pipeline(transaction=False)
            for key in chunk:
                pipe.execute_command("HGETALL", key, **{NEVER_DECODE: []})
            for key, fields in zip(chunk, pipe.execute(), strict=True):
                bucket = key[len(k.prefix) + len(family) - 2:]  # "d:<3 chars>" for both families
                for raw_field, hour in fields.items():
                    yield done_id(bucket, raw_field), as_text(hour)
        if family == "d:":  # the layouts of earlier releases: a sorted set (ms), a set (no time: now)
            for tid, ms in client.zscan_iter(k.done, count=1000):
                yield as_text(tid), str(int((ms - DONE_EPOCH_MS) // HOUR_MS))
            seconds, micros = client.time()
            hour = str((seconds * 1000 + micros // 1000 - DONE_EPOCH_MS) // HOUR_MS)
            for tid in client.sscan_iter(k.legacy_seen, count=1000):
                yield as_text(tid), hour

    # ------------------------------------------------------------------ items
    def _items(self) -> None:
        client, count = self.client, len(self.dst)
        for k in self.src:
            start = 0
            while keys := [as_text(key) for key in client.lrange(k.item_log, start, start + PAGE - 1)]:
                start += len(keys)
                rows: dict[int, list[str]] = {}
                for key, raw in zip(keys, client.hmget(k.items, keys), strict=True):
                    if raw is not None:
                        rows.setdefault(zlib.crc32(key.encode()) % count, []).extend((key, raw))
                for shard, flat in rows.items():
                    for at in range(0, len(flat), 2 * BATCH):
                        reply = as_text(self.queue._run("migrate_in", "i", *flat[at:at + 2 * BATCH],
                                                        shard=shard))
                        self.report.items += reply.count("1")
                self.progress("items", self.report.items)
