"""Conditional requests on a real worker against a real HTTP server that counts requests and serves
ETag / Last-Modified and 304s: the second crawl of the same URLs costs 304s, no items, and the tasks
complete (unchanged); a validator is never kept by an attempt that failed after its fetch."""

from __future__ import annotations

import json
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


def test_the_second_crawl_gets_304s_and_emits_nothing(make_cluster, vsite: ValidatorSite) -> None:
    for i in range(4):
        vsite.pages[f"/e/{i}"] = Page(f"<title>e{i}</title>", etag=f'"v1-{i}"')
    for i in range(2):
        vsite.pages[f"/m/{i}"] = Page(f"<title>m{i}</title>", modified=1_700_000_000 + i)
    paths = sorted(vsite.pages)
    cluster = make_cluster()
    cluster.worker("w1", concurrency=2)
    q = cluster.q
    ids = q.enqueue_many([vsite.url + p for p in paths], task="fetch_page")
    cluster.pump()
    wait_for(lambda: cluster.all_completed(ids), timeout=60, message="first crawl")
    first = q.stats()
    assert first["items"] == len(paths) and first["unchanged"] == 0
    for p in paths:
        (only,) = vsite.requests(p)
        assert (only.if_none_match, only.if_modified_since, only.status) == (None, None, 200)
    assert len(q.client.hgetall(q.keys.validators)) == len(paths)

    # The second crawl of the same URLs (the same task ids, a new run each): every page answers 304.
    assert set(q.recrawl(ids).values()) == {"queued"}
    cluster.pump()
    wait_for(lambda: q.stats()["unchanged"] == len(paths) and cluster.all_completed(ids), timeout=60,
             message="second crawl")
    for p in paths:
        again = vsite.requests(p)[1]
        assert again.status == 304, again
        if p.startswith("/e/"):
            assert again.if_none_match == vsite.pages[p].etag and again.if_modified_since is None
        else:
            assert again.if_none_match is None and again.if_modified_since
    second = q.stats()
    assert (second["items"], second["items_duplicate"]) == (first["items"], first["items_duplicate"])
    assert second["recrawled"] == len(paths) and second["dead"] == 0

    # One page changes: its third fetch is a 200 (new validator sent back next time), the others 304.
    vsite.pages["/e/0"] = Page("<title>e0 new</title>", etag='"v2-0"')
    assert set(q.recrawl(ids).values()) == {"queued"}
    cluster.pump()
    wait_for(lambda: q.stats()["unchanged"] == 2 * len(paths) - 1 and cluster.all_completed(ids),
             timeout=60, message="third crawl")
    assert [r.status for r in vsite.requests("/e/0")] == [200, 304, 200]
    assert q.stats()["items_duplicate"] == first["items_duplicate"] + 1  # re-emitted under its key
    assert q.client.hget(q.keys.validators, ids[paths.index("/e/0")]) == 'e:"v2-0"'


def test_a_failed_attempt_keeps_no_validator(make_cluster, vsite: ValidatorSite) -> None:
    vsite.pages["/p"] = Page("<title>p</title>", etag='"v1"')
    cluster = make_cluster(CELERY_HA_MAX_ATTEMPTS="3")
    cluster.worker("w1", concurrency=1)
    q = cluster.q
    tid = q.enqueue(vsite.url + "/p", task="test_fetch_then_fail")
    cluster.pump()
    wait_for(lambda: cluster.state(tid) == "completed", timeout=60, message="the retry's completion")
    # Attempt 1 fetched (200, ETag) and failed: attempt 2 fetched without a validator, got the page.
    assert [(r.if_none_match, r.status) for r in vsite.requests("/p")] == [(None, 200), (None, 200)]
    assert q.get(tid).attempt == 2 and q.stats()["items"] == 1
    # Only the completed attempt's item is stored, and it saw its page as changed (a full 200).
    assert json.loads(q.client.hget(q.keys.items, vsite.url + "/p"))["changed"] is True
    # The completed run kept it: a recrawl is conditional and completes unchanged.
    assert q.recrawl([tid]) == {tid: "queued"}
    cluster.pump()
    wait_for(lambda: q.stats()["unchanged"] == 1 and cluster.state(tid) == "completed", timeout=60,
             message="the recrawl")
    assert [(r.if_none_match, r.status) for r in vsite.requests("/p")][-1] == ('"v1"', 304)


def test_validators_max_zero_switches_conditional_requests_off(make_cluster, vsite: ValidatorSite) -> None:
    vsite.pages["/p"] = Page("<title>p</title>", etag='"v1"')
    cluster = make_cluster(CELERY_HA_VALIDATORS_MAX="0")
    cluster.worker("w1", concurrency=1)
    q = cluster.q
    tid = q.enqueue(vsite.url + "/p", task="fetch_page")
    for run in (1, 2):
        if run == 2:
            assert q.recrawl([tid]) == {tid: "queued"}
        cluster.pump()
        wait_for(lambda run=run: len(vsite.requests("/p")) == run and cluster.state(tid) == "completed",
                 timeout=60, message=f"run {run}")
    assert [(r.if_none_match, r.status) for r in vsite.requests("/p")] == [(None, 200), (None, 200)]
    assert q.stats()["unchanged"] == 0 and not q.client.exists(q.keys.validators)


def test_a_fetch_of_the_own_url_with_params_is_not_the_own_page(make_cluster, vsite: ValidatorSite) -> None:
    """``ctx.fetch(ctx.url, params=...)`` asks for another URL: it is sent no validator and leaves the
    own page's alone, so the next run's own fetch is a 304 and its second page a plain 200."""
    vsite.pages["/list"] = Page("<title>1</title>", etag='"list-v1"')
    vsite.pages["/list?page=2"] = Page("<title>2</title>", etag='"page2-v1"')
    cluster = make_cluster()
    cluster.worker("w1", concurrency=1)
    [tid] = cluster.q.enqueue_many([vsite.url + "/list"], task="test_pages_by_params")
    cluster.pump()
    wait_for(lambda: cluster.all_completed([tid]), timeout=60, message="the first run")
    assert cluster.q.client.hget(cluster.q.keys.validators, tid) == 'e:"list-v1"'
    assert set(cluster.q.recrawl([tid]).values()) == {"queued"}
    cluster.pump()
    wait_for(lambda: cluster.q.stats()["unchanged"] == 1 and cluster.all_completed([tid]), timeout=60,
             message="the second run, unchanged")
    own, second = vsite.requests("/list"), vsite.requests("/list?page=2")
    assert [(r.if_none_match, r.status) for r in own] == [(None, 200), ('"list-v1"', 304)], own
    assert [(r.if_none_match, r.status) for r in second] == [(None, 200)], second  # the 304 ended the run
