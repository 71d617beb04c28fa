"""Move a namespace into a new one, of another shard count (``celery-ha migrate``).

A namespace keeps the shard count it was first written with (``state/shards.py``): a task's shard is
a function of its id and the count, so changing the count in place would hide tasks in shards no
process reads. Growing past the pre-sharded count therefore goes through a new namespace, and this
module moves everything a crawl needs into it, with the source stopped:

* **Every task record**, as stored: attempts, stalls, errors, fencing token, dedup flag, meta, trace,
  refetch state. Queued tasks first, band by band and host queue by host queue in hand-out order,
  then every other record (``migrate_in.lua`` files each by its state: a dispatched one is queued, a
  running one counts a stall). Checkpoints follow their tasks. When the two passes' counts do not add
  up to the shard's (a queued record sits in no queue, or twice in one), a third takes every queued
  record. When the source changed while it was read (``state/migrate_read.py``: something still
  works on it), the changes are counted (``unseen``) and the migration stays open for a run once the
  source is stopped.
* **Ids** stay the same, except for gated tasks and dedup tasks of a gated namespace
  (``state/migrate_ids.py``): a gated task must sit on its host's shard, and a dedup task takes the
  id an enqueue into the target gives its URL; never an id another task keeps (``migmap`` in the
  target tells a re-run's own id from another task's while the migration runs).
* **Remembered finished URLs** (ids only, no URL) move as they are when their ids do not depend on
  the count (neither side places gated tasks by host, or the count is unchanged). Otherwise they are
  carried (``state/carried.py``): kept under ``cd:`` and looked up by the target's enqueue under the
  id the source gave the URL, so they stay duplicates. Ids the source carries from its own
  ancestors are carried on.
* **Settings** (``state/migrate_settings.py``): URL rules, the quiet window, the host gate's
  defaults, key mode and switch, each host's limits, blocks and counters (not its in-flight counts),
  refetch schedules, and the proxy pool's keys (with their expiry).
* **Sink items** in commit order, each in the target shard of its item key.

Not moved: counters and histograms (the target starts its own), ETag validators (a cache),
the worker registry. Idempotent: every write skips what the target holds already, so a migration
that stopped half-way (killed, Redis gone) is finished by running it again; one that finished does
nothing more. A run first takes both namespaces, atomically (``state/migrate_marks.py``): the target
remembers its source (meta ``migrating_from``, then ``migrated_from``) and refuses another source;
the source its target (``migrating_to``, then ``migrated_to``) and refuses another target. Then it
closes the source's shards to claims: no message left in the source's broker queue starts a task
there. The target is registered when it is complete, so the workers of a pattern serve it.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import redis
from redis.client import NEVER_DECODE

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.urls import DEFAULT_RULES
from celery_ha.state.carried import ANCESTORS_FIELD, Carry, set_carries, stored_carries
from celery_ha.state.counts import COUNTERS, queue_stats_many
from celery_ha.state.done_times import done_hour, done_id
from celery_ha.state.host_queues import as_text
from celery_ha.state.keys import QueueKeys
from celery_ha.state.migrate_ids import TargetIds
from celery_ha.state.migrate_marks import close, cut_short, finished, mark_done, take
from celery_ha.state.migrate_read import PAGE, changes, fingerprints, live_leases, queued_records
from celery_ha.state.migrate_settings import copy_settings
from celery_ha.state.namespaces import register
from celery_ha.state.pause import pause
from celery_ha.state.record_store import all_records, record_count
from celery_ha.state.records import TaskInfo
from celery_ha.state.shards import namespace_keys, shard_of
from celery_ha.state.taskqueue import TaskQueue
from celery_ha.state.url_rules import stored_rules
from celery_ha.state.worker_registry import list_workers

#: Per target shard while a migration runs: renamed id -> the source id it was given to (migrate_in.lua).
MIGMAP = "migmap"
BATCH = 200  # rows per migrate_in call: each call stays short (other clients wait behind it)

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
    unseen: int = 0  # transitions the source went through while it was read (something works on it)
    renamed: int = 0  # tasks whose id changed (the host gate places them on their host's shard)
    checkpoints: int = 0
    remembered: int = 0  # finished dedup ids the target remembers from this run
    carried: int = 0  # remembered ids whose meaning depends on the count, carried (state/carried.py)
    items: int = 0
    hosts: int = 0
    proxy_keys: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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
        on, mode = client.hmget(self.src[0].host_config, ["on", "km"])
        # Whether the gate was ever on ('0' once switched off): its tasks' ids may depend on the count.
        self.ids = TargetIds(client, self.src, shards, stored_rules(client, source) or DEFAULT_RULES,
                             mode or "host", on in ("0", "1"))
        self._collided: dict[str, set[str]] = {}  # source id -> target ids another task was given

    # ------------------------------------------------------------------ checks
    def check(self, lease_ttl: float) -> None:
        """Refuse (ConfigurationError, nothing written) a source with live workers or leases, an empty
        one, one migrated (or migrating) elsewhere, or a target that holds anything but an earlier run
        of this same migration. A run cut short between its last marks passes: run() writes the rest."""
        live = list_workers(self.client, self.source, max_age=lease_ttl)
        if live:
            raise ConfigurationError(
                f"stop the workers of {self.source!r} first: {len(live)} worker process(es) heartbeat "
                f"within the lease ({lease_ttl:g} s); a task they hold would run in both namespaces")
        # A worker that does not heartbeat (a standalone claim_next loop) shows only by its leases.
        leases = live_leases(self.client, self.src)
        if leases:
            raise ConfigurationError(
                f"stop the workers of {self.source!r} first: {leases} task(s) hold a lease that has not "
                f"expired (a worker without a heartbeat runs them?); run it again once they have ended")
        running, done = self.client.hmget(QueueKeys(self.target).meta, ["migrating_from", "migrated_from"])
        moved, moving = self.client.hmget(QueueKeys(self.source).meta, ["migrated_to", "migrating_to"])
        if done is not None:
            if cut_short(self.client, self.source, self.target):
                return  # run() finishes them
            raise ConfigurationError(f"namespace {self.target!r} was migrated from {done!r} already")
        origin = running
        if origin is not None and origin != self.source:
            raise ConfigurationError(
                f"namespace {self.target!r} was migrated from {origin!r}, not {self.source!r}")
        if moved is not None and (moved != self.target or origin is None):
            raise ConfigurationError(f"namespace {self.source!r} was migrated to {moved!r} already: "
                                     f"migrate {moved!r} instead")
        if moving not in (None, self.target) and self.client.hget(
                QueueKeys(moving).meta, "migrating_from") == self.source:
            raise ConfigurationError(
                f"namespace {self.source!r} is being migrated to {moving!r}: finish that migration "
                f"(run it again) or purge {moving!r} first")
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
    def finished(self) -> bool:
        """Whether this migration ended already, every mark written (``celery-ha migrate`` then only
        seals it; run() would go through everything again and move nothing)."""
        return finished(self.client, self.source, self.target)

    def seal(self) -> None:
        """A finished migration's source closed to claims and its target registered (idempotent): what
        a release before these marks did not write."""
        close(self.client, self.src, self.target)
        register(self.client, self.target)

    def run(self) -> MigrationReport:
        """Take both namespaces (ConfigurationError when another migration holds one), close the
        source to claims and pause it, copy settings, tasks, remembered ids and items; mark both."""
        client = self.client
        short = cut_short(client, self.source, self.target)  # read before take() writes migrating_from
        take(client, self.source, self.target)
        close(client, self.src, self.target)  # from now on no claim in the source starts a task
        if short:
            self._mark_done()  # everything moved; a run before this one stopped between its marks
            return self.report
        pause(client, self.source, reason=f"migrated to {self.target}")
        self.queue._ensure_layout()  # records the target's shard count (an empty namespace takes any)
        self.report.hosts, self.report.proxy_keys = copy_settings(client, self.source, self.target, self.src,
                                                                   self.dst)
        before = fingerprints(client, self.src)
        for index, k in enumerate(self.src):
            # The queued records in hand-out order first, then every other record. When the first
            # pass's count is not that of the shard's queued records and of its queues' (a queued
            # record sits in no queue, or twice in one; or the shard changed meanwhile), a third pass
            # takes every queued record (those in already are skipped, counted present once).
            queued = self._import(queued_records(client, k), k)
            others = self._import(((tid, raw, info) for tid, raw in all_records(client, k)
                                   if (info := TaskInfo.parse(tid, raw)).state != "queued"), k)
            counts = {queued, record_count(client, k) - others, queue_stats_many(client, [k])[0]["queued"]}
            if len(counts) > 1 or fingerprints(client, [k]) != before[index:index + 1]:
                present = self.report.present
                self._import(((tid, raw, info) for tid, raw in all_records(client, k)
                              if (info := TaskInfo.parse(tid, raw)).state == "queued"), k)
                self.report.present = present
            self.progress(f"tasks of shard {index}", sum(self.report.tasks.values()))
        self._remembered()
        self._items()
        # Whatever changed in the source while it was read may be missing (or stale) in the target.
        self.report.unseen = changes(before, fingerprints(client, self.src))
        if self.report.unseen:
            return self.report  # still migrating: a run once the source is stopped finishes it
        for k in self.dst:
            client.unlink(k.prefix + MIGMAP)
        self._counters()
        self._mark_done()
        return self.report

    def _mark_done(self) -> None:
        """The target registered (a pattern's workers serve it from then on), then the last marks
        (``migrate_marks.mark_done``: source first)."""
        register(self.client, self.target)
        mark_done(self.client, self.source, self.target)

    #: The counters a namespace keeps for its whole life (``stats``), as opposed to counts of its state.
    LIFETIME = frozenset((*COUNTERS, "completed", "died"))

    def _counters(self) -> None:
        """Add the source's lifetime counters (completed, items, enqueued, …) to the target's first
        shard, once (meta ``counters_from``), so ``stats`` goes on counting where the source stopped
        (a crash between the mark and the adds loses them: counts only, no task)."""
        if not self.client.hsetnx(QueueKeys(self.target).meta, "counters_from", self.source):
            return
        totals: Counter[str] = Counter()
        for k in self.src:
            for name, value in self.client.hgetall(k.stats).items():
                if as_text(name) in self.LIFETIME:
                    totals[as_text(name)] += int(value)
        pipe = self.client.pipeline(transaction=False)
        for name, value in totals.items():
            pipe.hincrby(self.dst[0].stats, name, value)
        pipe.execute()

    # ------------------------------------------------------------------ settings
    # ------------------------------------------------------------------ tasks
    def _import(self, records: Iterable[tuple[str, str, TaskInfo]], k: QueueKeys) -> int:
        """Take ``records`` (id, record, parsed) of source shard ``k`` in; returns how many it went
        through."""
        page: list[tuple[str, str, TaskInfo]] = []
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

    def _import_page(self, page: list[tuple[str, str, TaskInfo]], k: QueueKeys) -> None:
        client = self.client
        old_ids = [tid for tid, _, _ in page]
        pipe = client.pipeline(transaction=False)
        pipe.hmget(k.checkpoints, old_ids)
        pipe.zmscore(k.refetch, old_ids)
        pipe.zmscore(k.completed, old_ids)
        checkpoints, refetch, history = pipe.execute()
        infos = [info for _, _, info in page]
        news = [self.ids.new_id(old, info) for old, info in zip(old_ids, infos, strict=True)]
        moved = [j for j, (old, new) in enumerate(zip(old_ids, news, strict=True)) if new != old]
        if moved:  # the rare renamed id that another source task keeps: the next candidate
            clash = self.ids.taken([news[j] for j in moved])
            for j in moved:
                if news[j] in clash:
                    news[j] = self.ids.new_id(old_ids[j], infos[j], lambda tid: bool(self.ids.taken([tid])))
        groups: dict[int, list[tuple[str, list[str], TaskInfo]]] = {}
        for (old, raw, info), new, ckpt, due, at in zip(page, news, checkpoints, refetch, history,
                                                        strict=True):
            row = [new, raw, ckpt or "", "" if due is None else f"{due:.0f}",
                   "" if at is None else f"{at:.0f}", "" if new == old else old]
            groups.setdefault(shard_of(new, len(self.dst)), []).append((old, row, info))
        for shard, rows in groups.items():
            for at in range(0, len(rows), BATCH):
                self._send_rows(shard, rows[at:at + BATCH])

    def _send_rows(self, shard: int, rows: list[tuple[str, list[str], TaskInfo]]) -> None:
        """One migrate_in call for ``rows`` of one target shard. A renamed task whose id another
        renamed task took in this migration (two tasks of one URL under two host keys) gets its next
        candidate, sent again (``migrate_in.lua`` keeps which task each renamed id was given to)."""
        args = [v for _, row, _ in rows for v in row]
        reply = as_text(self.queue._run("migrate_in", "r", *args, shard=shard))
        for (old, row, info), code in zip(rows, reply, strict=True):
            if code == "C":
                tried = self._collided.setdefault(old, set())
                tried.add(row[0])
                row[0] = self.ids.new_id(old, info,
                                     lambda tid, tried=tried: tid in tried or bool(self.ids.taken([tid])))
                self._send_rows(shard_of(row[0], len(self.dst)), [(old, row, info)])
                continue
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
        ids = self.ids
        same = len(self.src) == len(self.dst) and ids.src_by_host == ids.dst_by_host
        return same or not (ids.src_by_host or ids.dst_by_host)

    def _remembered(self) -> None:
        """Remembered ids move as they are when they keep their meaning; otherwise they are carried
        (``state/carried.py``), as are the ids the source itself carries from its own ancestors."""
        moves = self.remembered_moves()
        own = Carry(len(self.src), self.ids.src_by_host)
        carries = stored_carries(self.client, self.source)
        if not moves:
            carries.append(own)
        # The outbox replay maps an id an ancestor gave to this namespace's (state/replay.py): kept
        # from the source's lineage and from a run before this one, with the source itself whenever
        # its ids meant something else here (remembered ids carried, or tasks renamed, such as dedup
        # tasks queued while a gate now on was off).
        ancestors = [*stored_carries(self.client, self.source, ANCESTORS_FIELD),
                     *stored_carries(self.client, self.target, ANCESTORS_FIELD)]
        if not moves or self._renamed_any():
            ancestors.append(own)
        for k in self.src:
            self._send("m" if moves else "c", self._bucket_ids(k, "d:"))
            self._send("c", self._bucket_ids(k, "cd:"))
        set_carries(self.client, self.target, carries)
        set_carries(self.client, self.target, list(dict.fromkeys(ancestors)), ANCESTORS_FIELD)

    def _renamed_any(self) -> bool:
        """Whether this migration renamed a task, in this run or one before it: a re-run finds the
        renamed tasks in (``renamed`` 0), but their ``migmap`` entries stay until the last marks."""
        if self.report.renamed:
            return True
        pipe = self.client.pipeline(transaction=False)
        for k in self.dst:
            pipe.exists(k.prefix + MIGMAP)
        return any(pipe.execute())

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
                yield as_text(tid), str(done_hour(ms))
            seconds, micros = client.time()
            hour = str(done_hour(seconds * 1000 + micros // 1000))
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
