"""``enqueue_on_commit`` in a real Django project: queued on commit only, validated at the call."""

from __future__ import annotations

import redis

from celery_ha.state.keys import QueueKeys
from tests.contrib.django.conftest import Project
from tests.support.records import has_record


def test_a_task_is_queued_when_the_transaction_commits_and_not_before(project: Project,
                                                                       r: redis.Redis) -> None:
    out = project.scenario("commit")
    assert out["inside"] == {"outbox": 1, "redis": None}  # written in the transaction, not in Redis yet
    assert out["after"] == {"outbox": 0, "redis": "queued"}  # pushed after the commit, row removed
    assert (out["task"], out["priority"], out["meta"], out["max_attempts"], out["dedup"]) == (
        "crawl_list", 3, {"o": 1}, 2, True)
    assert out["max_stalls"] == 3 and out["namespace"] == "shop"  # CELERY_HA["NAMESPACE"]
    assert has_record(r, QueueKeys("shop"), out["id"])
    assert project.db.count("shop_order") == 1
    # dedup=False: a task of its own each time, queued once each
    assert len(set(out["plain"]) | {out["id"]}) == 3 and out["plain_states"] == ["queued", "queued"]


def test_a_rollback_queues_nothing(project: Project, r: redis.Redis) -> None:
    out = project.scenario("rollback")
    assert out["id"] and out["redis"] is None
    assert (out["outbox"], out["orders"]) == (0, 0)
    # Nothing of the project's namespace (a process of an earlier test may still write its own keys).
    assert r.keys("cha:{shop}*") == []


def test_a_rolled_back_savepoint_queues_nothing_of_its_own(project: Project) -> None:
    out = project.scenario("savepoint")
    assert out["before_outer_commit"] == {"kept": None, "nested": None}  # a savepoint commit is not a commit
    assert (out["kept"], out["nested"], out["dropped"]) == ("queued", "queued", None)
    assert out["outbox"] == 0


def test_outside_a_transaction_it_queues_at_once(project: Project) -> None:
    out = project.scenario("autocommit")
    assert out["state"] == "queued" and out["outbox"] == 0
    assert out["many"][0] == out["many"][2]  # a duplicate gets the existing task's id
    assert out["many_states"] == ["queued"] * 3
    assert (out["stats"]["enqueued"], out["stats"]["duplicates"]) == (3, 1)


def test_bad_input_raises_at_the_call_and_writes_nothing(project: Project, r: redis.Redis) -> None:
    out = project.scenario("bad_input")
    assert len(out["errors"]) == 6, out["errors"]
    assert "unknown task field(s): colour" in out["errors"][-1]
    assert out["outbox_inside"] == 0 and out["orders"] == 1 and out["outbox"] == 0
    assert out["stats"]["enqueued"] == 0
    # Nothing of the project's namespace (a process of an earlier test may still write its own keys).
    assert r.keys("cha:{shop}*") == []


def test_a_view_enqueues_through_one_client_per_process(project: Project) -> None:
    out = project.scenario("view")
    assert out["good"] == 200 and out["state"] == "queued"
    assert out["bad"] == 400 and "javascript" in out["bad_body"]["error"]
    assert out["orders"] == 21  # the bad request's order was rolled back with it
    assert out["outbox"] == 0 and out["queued"] == 21
    # Twenty requests, each on its own thread: the connections are reused, not one per request.
    assert out["connections"] <= 2, out


def test_a_traced_view_hands_its_trace_to_the_task(project: Project) -> None:
    """With OpenTelemetry on, the task carries the view's span (``celery_ha.base.tracing``), although
    the push after the commit runs in another thread: every attempt's span will be in the view's trace."""
    import pytest

    pytest.importorskip("opentelemetry.sdk", reason="the otel extra (opentelemetry-sdk) is not installed")
    out = project.scenario("traced_view")
    assert out["trace"] == out["view"]
