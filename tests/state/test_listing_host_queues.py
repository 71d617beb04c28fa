"""``tasks --state queued`` pages through the host gate's queues (host after host, claim order within
a host) without losing or repeating a task, also when a page starts in a later chunk of hosts (their
queue lengths are read a chunk of hosts per round trip). Real Redis."""

from __future__ import annotations

import pytest

from celery_ha import TaskQueue
from celery_ha.state import listing
from celery_ha.state.listing import list_tasks


@pytest.fixture
def q(redis_url: str) -> TaskQueue:
    return TaskQueue.from_url(redis_url, "lh")


@pytest.mark.parametrize("chunk", [1000, 3])
def test_pages_of_queued_tasks_over_many_hosts_cover_each_task_once(q: TaskQueue, chunk: int,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listing, "SCAN_PAGE", chunk)  # 3: the 7 hosts' lengths in chunks of 3, 3, 1
    ungated = q.enqueue_many([f"http://plain.example/{i}" for i in range(2)])  # before the gate: bands
    q.hosts.switch(True)
    urls = [f"http://h{h}.example/p{i}" for h in range(7) for i in range(h + 1)]  # 1..7 tasks per host
    q.enqueue_many(urls)
    everything = [t.id for t in list_tasks(q, "queued", limit=1000)]
    assert len(everything) == len(set(everything)) == 2 + len(urls)
    assert everything[:2] == ungated  # the ready bands first, then the host queues
    by_host = [q.get(tid).url.split("/")[2] for tid in everything[2:]]
    assert by_host == sorted(by_host)  # host after host
    paged: list[str] = []
    for offset in range(0, len(everything) + 5, 4):
        paged += [t.id for t in list_tasks(q, "queued", limit=4, offset=offset)]
    assert paged == everything
