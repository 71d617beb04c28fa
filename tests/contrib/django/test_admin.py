"""The admin pages with Django's test client: staff see counts, dead letters, a task and the outbox;
non-staff and anonymous users are sent to the login page; redrive and relay act."""

from __future__ import annotations

import redis

from celery_ha import TaskQueue
from celery_ha.runtime.redis_process import free_port
from celery_ha.state.keys import QueueKeys
from tests.contrib.django.conftest import Project
from tests.support.records import has_record

PAGES = ("/admin/celery-ha/", "/admin/celery-ha/dead/", "/admin/celery-ha/task/{dead}/",
         "/admin/celery-ha/outbox/")


def _seed(redis_url: str) -> tuple[str, str]:
    """One dead task (with its reason and a checkpoint) and one queued task, in namespace shop."""
    q = TaskQueue.from_url(redis_url, namespace="shop", max_attempts=1)
    dead = q.enqueue("https://shop.example/broken", task="fetch_page")
    other = q.enqueue("https://shop.example/fine", task="crawl_list")
    lease = q.claim(dead, worker="w1")
    assert lease is not None
    q.save_checkpoint(lease, {"page": 7})
    assert q.fail(lease, "HTTP 404 on https://shop.example/broken", retry=False) == "dead"
    return dead, other


def test_staff_see_the_pages_and_others_are_sent_to_the_login(project: Project, redis_url: str,
                                                               r: redis.Redis) -> None:
    dead, other = _seed(redis_url)
    project.db.insert_outbox("LeftOver0003", {"url": "https://shop.example/left", "task": "fetch_page",
                                              "priority": 0, "dedup": False})
    out = project.scenario("admin_pages", dead=dead, other=other)
    pages = [p.format(dead=dead) for p in PAGES]
    for who in ("anonymous", "member"):
        for page in pages:
            seen = out[who][page]
            assert seen["status"] == 302 and seen["location"].startswith("/admin/login/"), (who, page, seen)
        assert out[who]["redrive"] == 302  # to the login, not a redrive:
    staff = out["staff"]
    assert all(staff[p]["status"] == 200 for p in pages), {p: staff[p]["status"] for p in pages}

    dashboard = staff[pages[0]]["body"]
    assert '<td class="state-dead">1</td>' in dashboard and '<td class="state-queued">1</td>' in dashboard
    assert "1 request(s) committed but not in Redis yet" in dashboard
    listing = staff[pages[1]]["body"]
    assert dead in listing and "HTTP 404 on https://shop.example/broken" in listing
    detail = staff[pages[2]]["body"]
    assert '<td id="task-state">dead</td>' in detail and '<td id="task-attempts">1/1</td>' in detail
    assert "HTTP 404" in detail and "&#x27;page&#x27;: 7" in detail  # last error and checkpoint
    assert "LeftOver0003" in staff[pages[3]]["body"]

    assert out["after_redrive"] == "queued"  # the staff POST redrove it (the others' did nothing)
    assert r.hget("cha:{shop}:stats", "redriven") == "1"
    assert out["unknown_task"] == 404
    assert out["lookup"] == f"/admin/celery-ha/task/{other}/"


def test_the_outbox_page_relays_on_request(project: Project, r: redis.Redis) -> None:
    project.db.insert_outbox("LeftOver0004", {"url": "https://shop.example/left", "task": "fetch_page",
                                              "priority": 0, "dedup": False})
    out = project.scenario("outbox_page")
    assert "LeftOver0004" in out["listed"] and "1 request(s) committed" in out["dashboard"]
    assert "Relayed 1 request(s), 0 left" in out["relayed"]  # the admin capitalizes messages
    assert out["outbox"] == 0 and has_record(r, QueueKeys("shop"), "LeftOver0004")


def test_an_unreachable_redis_is_a_page_saying_so(project: Project) -> None:
    out = project.scenario("unreachable_page", env={"DJPROJ_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    assert out["status"] == 503 and 'id="unreachable"' in out["body"]
    assert out["seconds"] < 5
