"""Refetch schedules on real workers against a real HTTP server that logs every request: with only
`set_schedule` and one enqueue, list pages are re-read on their interval and detail pages on theirs,
a page that keeps answering 304 is visited less and less (and costs no items), a page that keeps
changing more and more often — all judged by the site's own request log."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.support.celery_helpers import wait_for
from tests.support.validator_site import Page, ValidatorSite

pytestmark = pytest.mark.slow


@pytest.fixture
def vsite() -> Iterator[ValidatorSite]:
    s = ValidatorSite().start()
    yield s
    s.stop()


def _gaps(site: ValidatorSite, path: str) -> list[float]:
    times = [r.time for r in site.requests(path)]
    return [b - a for a, b in itertools.pairwise(times)]


def test_schedules_refetch_without_the_operator_and_adapt(make_cluster, vsite: ValidatorSite) -> None:
    counter = itertools.count()
    vsite.pages["/list"] = Page("<title>list</title>")
    vsite.pages["/same"] = Page("<title>same</title><p>never changes</p>", etag='"v1"')
    vsite.pages["/moving"] = Page(lambda: f"<title>moving</title><p>{next(counter)}</p>")
    cluster = make_cluster()
    q = cluster.q
    q.set_schedule("test_list", every=1)
    q.set_schedule("fetch_page", every=2, min_every=1, max_every=30, adaptive=True)
    cluster.worker("w1", concurrency=2)
    lst = q.enqueue(vsite.url + "/list", task="test_list")
    same, moving = q.enqueue_many([vsite.url + "/same", vsite.url + "/moving"], task="fetch_page")
    cluster.pump()
    # Nobody enqueues again: the workers' sweep queues each run when its time comes.
    wait_for(lambda: len(vsite.requests("/same")) >= 4 and len(vsite.requests("/moving")) >= 4,
             timeout=120, message="four visits of each detail page")
    wait_for(lambda: cluster.all_completed([lst, same, moving]), timeout=30, message="runs finished")

    # A run comes no earlier than its interval after the previous one finished.
    list_gaps = _gaps(vsite, "/list")
    assert len(list_gaps) >= 4 and min(list_gaps) >= 1.0, list_gaps
    # /same answers 304 from its second visit: unchanged, so 2 s, then x1.4 each time.
    same_gaps = _gaps(vsite, "/same")
    assert [r.status for r in vsite.requests("/same")][:4] == [200, 304, 304, 304]
    for gap, interval in zip(same_gaps, (2.0, 2.8, 3.92), strict=False):
        assert gap >= interval, same_gaps
    assert q.get(same).refetch_every >= 5.488 - 1e-6
    # /moving changes on every visit: 2 s, then x0.8 each time (its signature differs).
    moving_gaps = _gaps(vsite, "/moving")
    for gap, interval in zip(moving_gaps, (2.0, 1.6, 1.28), strict=False):
        assert gap >= interval, moving_gaps
    assert q.get(moving).refetch_every <= 1.28 + 1e-6
    # 304s cost no items: /same gave one item (its first visit), /moving one per visit (same key).
    stats = q.stats()
    assert stats["unchanged"] >= 3 and stats["refetched"] >= 3 * 3
    assert stats["dead"] == 0 and stats["items"] == 2  # one key per page: later visits add none
