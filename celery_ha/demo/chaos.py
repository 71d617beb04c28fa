"""Chaos for the demo: SIGKILL busy pool children and a whole worker, and time each failover.

A failover is measured from the kill to the moment every task the victim held has moved on: its
fencing token grew (another process claimed it) or it finished. That is the latency an operator
cares about: how long a page sat orphaned. Pool-child kills are covered by fast failover (the
worker's main process releases the lease at once); a whole worker that dies is covered by lease
expiry plus the reclaim sweep, so its latency is about the lease TTL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field

import redis

from celery_ha.base.procfs import child_pids
from celery_ha.state import TaskQueue
from celery_ha.state.worker_registry import running_by_worker, split_worker


@dataclass
class Failover:
    """One kill and what became of the tasks the victim held."""

    kind: str  # "pool child" or "worker"
    victim: str
    killed_at: float
    held: dict[str, int]  # task id -> token at kill time
    recovered_at: float | None = None

    @property
    def latency(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.killed_at


@dataclass
class Chaos:
    """Kills processes and tracks the failovers they cause."""

    client: redis.Redis
    queue: TaskQueue
    namespace: str
    failovers: list[Failover] = field(default_factory=list)

    def _holders(self) -> dict[str, list[str]]:
        return running_by_worker(self.client, self.namespace)

    def _snapshot(self, task_ids: list[str]) -> dict[str, int]:
        infos = self.queue.get_many(task_ids)
        return {i.id: i.token for i in infos if i is not None and i.state == "running"}

    def kill_busy_child(self, worker_pids: list[int]) -> Failover | None:
        """SIGKILL one pool child of ``worker_pids`` that holds a lease; None if none is busy now."""
        children = {c: w for w in worker_pids for c in child_pids(w)}
        for holder, task_ids in self._holders().items():
            pid = split_worker(holder)[1]
            if pid in children:
                held = self._snapshot(task_ids)
                if not held:
                    continue
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    event = Failover("pool child", holder, time.monotonic(), held)
                    self.failovers.append(event)
                    return event
        return None

    def leases_by_worker(self, workers: dict[str, int]) -> dict[str, int]:
        """How many leases the processes of each worker (name -> main pid) hold right now."""
        counts = dict.fromkeys(workers, 0)
        owner = {p: name for name, pid in workers.items() for p in (pid, *child_pids(pid))}
        for holder, task_ids in self._holders().items():
            pid = split_worker(holder)[1]
            if pid in owner:
                counts[owner[pid]] += len(task_ids)
        return counts

    def kill_worker(self, name: str, pgid: int) -> Failover:
        """SIGKILL a whole worker (main process and pool: its process group), like a host dying."""
        node_pids = {pgid, *child_pids(pgid)}
        held_ids = [tid for holder, tids in self._holders().items()
                    if split_worker(holder)[1] in node_pids for tid in tids]
        held = self._snapshot(held_ids)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        event = Failover("worker", name, time.monotonic(), held)
        self.failovers.append(event)
        return event

    def update(self) -> None:
        """Mark failovers whose orphaned tasks were all picked up again (or finished)."""
        pending = [f for f in self.failovers if f.recovered_at is None]
        if not pending:
            return
        ids = sorted({tid for f in pending for tid in f.held})
        infos = {i.id: i for i in self.queue.get_many(ids) if i is not None}
        now = time.monotonic()
        for f in pending:
            moved = all(
                (info := infos.get(tid)) is None or info.token > token or info.state in ("completed", "dead")
                for tid, token in f.held.items())
            if moved:
                f.recovered_at = now
