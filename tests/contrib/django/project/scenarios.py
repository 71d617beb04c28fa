"""Scenarios the tests run in a child process: ``python scenarios.py NAME [JSON kwargs]``.

Django is set up here, in the child, never in the pytest process (celery_ha.base.settings would read
this project's settings in every later test). Each scenario prints one JSON line (its observations);
the tests assert on it and on Redis and the database themselves.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import datetime
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djproj.settings")

import django

django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.core.management.base import CommandError  # noqa: E402
from django.db import transaction  # noqa: E402
from django.test import Client  # noqa: E402
from djproj.shop.models import Order  # noqa: E402

from celery_ha import InvalidInput  # noqa: E402
from celery_ha.base.errors import TaskNotFound  # noqa: E402
from celery_ha.contrib.django import enqueue_many_on_commit, enqueue_on_commit  # noqa: E402
from celery_ha.contrib.django.models import OutboxEntry  # noqa: E402
from celery_ha.contrib.django.outbox import relay  # noqa: E402
from celery_ha.contrib.django.runtime import CLIENT_NAME, current_config, runtime  # noqa: E402


def _state(task_id: str) -> str | None:
    try:
        return str(runtime().queue().get(task_id).state)
    except TaskNotFound:
        return None


def _outbox() -> int:
    return OutboxEntry.objects.count()


def commit() -> dict[str, Any]:
    with transaction.atomic():
        Order.objects.create(url="https://shop.example/o/1")
        tid = enqueue_on_commit("https://shop.example/o/1", task="crawl_list", priority=3, meta={"o": 1},
                                max_attempts=2)
        inside = {"outbox": _outbox(), "redis": _state(tid)}
    info = runtime().queue().get(tid)
    plain = []
    for _ in range(2):  # the same URL without dedup, committed twice: two tasks
        with transaction.atomic():
            plain.append(enqueue_on_commit("https://shop.example/o/1", dedup=False))
    return {"id": tid, "inside": inside, "after": {"outbox": _outbox(), "redis": str(info.state)},
            "task": info.task, "priority": info.priority, "meta": info.meta,
            "max_attempts": info.max_attempts, "max_stalls": info.max_stalls, "dedup": info.dedup,
            "namespace": runtime().queue().namespace, "plain": plain,
            "plain_states": [_state(i) for i in plain]}


def rollback() -> dict[str, Any]:
    tid = None
    try:
        with transaction.atomic():
            Order.objects.create(url="https://shop.example/o/2")
            tid = enqueue_on_commit("https://shop.example/o/2", dedup=False)
            raise RuntimeError("the view failed")
    except RuntimeError:
        pass
    return {"id": tid, "redis": _state(tid), "outbox": _outbox(), "orders": Order.objects.count()}


def savepoint() -> dict[str, Any]:
    with transaction.atomic():
        kept = enqueue_on_commit("https://shop.example/kept")
        try:
            with transaction.atomic():  # a savepoint
                dropped = enqueue_on_commit("https://shop.example/dropped")
                raise RuntimeError("inner block failed")
        except RuntimeError:
            pass
        inner_ok = transaction.atomic()
        with inner_ok:  # a savepoint that commits: its task goes with the outer commit
            nested = enqueue_on_commit("https://shop.example/nested")
        before_outer = {"kept": _state(kept), "nested": _state(nested)}
    return {"kept": _state(kept), "dropped": _state(dropped), "nested": _state(nested),
            "before_outer_commit": before_outer, "outbox": _outbox()}


def autocommit() -> dict[str, Any]:
    tid = enqueue_on_commit("https://shop.example/now")
    first = _state(tid)
    ids = enqueue_many_on_commit(["https://shop.example/m1",
                                  {"url": "https://shop.example/m2", "priority": 9},
                                  "https://shop.example/m1"], task="fetch_page")
    return {"state": first, "outbox": _outbox(), "many": ids, "many_states": [_state(i) for i in ids],
            "stats": runtime().queue().stats()}


def bad_input() -> dict[str, Any]:
    errors = []
    with transaction.atomic():
        Order.objects.create(url="https://shop.example/o/3")
        for kwargs in ({"url": "ftp://nope"}, {"url": "https://ok.example/", "priority": 10**6},
                       {"url": "https://ok.example/", "task": "bad task\n"},
                       {"url": "https://ok.example/", "meta": {"x": object()}},
                       {"url": "https://ok.example/", "max_attempts": 0}):
            try:
                enqueue_on_commit(**kwargs)
            except InvalidInput as exc:
                errors.append(str(exc))
        try:  # one bad spec: nothing of the batch is written
            enqueue_many_on_commit(["https://ok.example/a", {"url": "https://ok.example/b", "colour": "red"}])
        except InvalidInput as exc:
            errors.append(str(exc))
        inside = _outbox()
        orders = Order.objects.count()  # the transaction is still usable
    return {"errors": errors, "outbox_inside": inside, "orders": orders, "outbox": _outbox(),
            "stats": runtime().queue().stats()}


def view() -> dict[str, Any]:
    client = Client()
    good = client.post("/orders/", {"url": "https://shop.example/view"})
    bad = client.post("/orders/", {"url": "javascript:alert(1)"})
    body = good.json()
    threads_before = {c["id"] for c in runtime().client.client_list() if c.get("name") == CLIENT_NAME}
    for i in range(20):  # twenty requests, each in its own thread like a threaded server's
        t = threading.Thread(target=client.post, args=("/orders/", {"url": f"https://shop.example/t/{i}"}))
        t.start()
        t.join()
    named = [c for c in runtime().client.client_list() if c.get("name") == CLIENT_NAME]
    return {"good": good.status_code, "bad": bad.status_code, "bad_body": bad.json(), "task": body["task"],
            "state": _state(body["task"]), "orders": Order.objects.count(), "outbox": _outbox(),
            "connections": len(named), "connections_before": len(threads_before),
            "queued": runtime().queue().stats()["queued"]}


def hold_after_commit() -> dict[str, Any]:
    """Commit, then block before the push (a callback registered first runs first): the test kills us."""
    with transaction.atomic():
        transaction.on_commit(lambda: (print("COMMITTED", flush=True), time.sleep(60)))
        tid = enqueue_on_commit("https://shop.example/killed", dedup=False)
        print(f"ID {tid}", flush=True)
    return {"not": "reached"}


def paused(warm: bool = True) -> dict[str, Any]:
    """Wait for GO on stdin (the test freezes Redis meanwhile), then commit and time it."""
    if warm:  # a connection already open, and the scripts loaded, before Redis freezes
        enqueue_on_commit("https://shop.example/warm-up")
    print("READY", flush=True)
    sys.stdin.readline()
    start = time.monotonic()
    with transaction.atomic():
        a = enqueue_on_commit("https://shop.example/paused-dedup")
        b = enqueue_on_commit("https://shop.example/paused-plain", dedup=False)
    return {"ids": [a, b], "seconds": time.monotonic() - start, "outbox": _outbox()}


def admin_pages(dead: str, other: str) -> dict[str, Any]:
    """Every page for anonymous, non-staff and staff users; the redrive and relay actions."""
    User.objects.create_user("staff", password="pw", is_staff=True)
    User.objects.create_user("member", password="pw")
    pages = ["/admin/celery-ha/", "/admin/celery-ha/dead/", f"/admin/celery-ha/task/{dead}/",
             "/admin/celery-ha/outbox/"]
    out: dict[str, Any] = {}
    for who in ("anonymous", "member", "staff"):
        client = Client()
        if who != "anonymous":
            assert client.login(username=who, password="pw")
        out[who] = {}
        for page in pages:
            response = client.get(page)
            out[who][page] = {"status": response.status_code, "location": response.get("Location", ""),
                              "body": response.content.decode() if response.status_code == 200 else ""}
        out[who]["redrive"] = client.post("/admin/celery-ha/dead/", {"ids": [dead]}).status_code
    staff = Client()
    staff.login(username="staff", password="pw")
    out["after_redrive"] = _state(dead)
    out["unknown_task"] = staff.get("/admin/celery-ha/task/nope/").status_code
    out["lookup"] = staff.get("/admin/celery-ha/", {"task": other}).get("Location")
    return out


def outbox_page() -> dict[str, Any]:
    """The outbox page lists leftovers; its POST relays them."""
    User.objects.create_user("staff", password="pw", is_staff=True)
    client = Client()
    client.login(username="staff", password="pw")
    listed = client.get("/admin/celery-ha/outbox/").content.decode()
    dashboard = client.get("/admin/celery-ha/").content.decode()
    relayed = client.post("/admin/celery-ha/outbox/", follow=True)
    return {"listed": listed, "dashboard": dashboard, "relayed": relayed.content.decode(),
            "outbox": _outbox()}


def unreachable_page() -> dict[str, Any]:
    User.objects.create_user("staff", password="pw", is_staff=True)
    client = Client()
    client.login(username="staff", password="pw")
    start = time.monotonic()
    response = client.get("/admin/celery-ha/")
    return {"status": response.status_code, "body": response.content.decode(),
            "seconds": time.monotonic() - start}


def config() -> dict[str, Any]:
    cfg = current_config()  # runtime() would connect (and start the embedded Redis when asked for)
    return {"namespace": cfg.settings.namespace, "max_attempts": cfg.settings.max_attempts,
            "lease_ttl": cfg.settings.lease_ttl, "push_timeout": cfg.push_timeout, "embedded": cfg.embedded,
            "redis_url": cfg.settings.redis_url}


def call_cli() -> dict[str, Any]:
    """``call_command`` runs the same CLI; a failing command becomes CommandError."""
    call_command("celery_ha", "stats", "--json")
    try:
        call_command("celery_ha", "task", "no-such-id")
    except CommandError as exc:
        return {"error": str(exc), "returncode": exc.returncode}
    return {"error": None}


def traced_view() -> dict[str, Any]:
    """The view under a span (as a traced Django server runs it): the task carries the view's trace,
    although its push runs later, in a pusher thread."""
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("djproj")
    with tracer.start_as_current_span("POST /orders/") as span:
        body = Client().post("/orders/", {"url": "https://shop.example/traced"}).json()
    ctx = span.get_span_context()
    return {"task": body["task"], "trace": runtime().queue().get(body["task"]).trace,
            "view": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"}


def commit_url(url: str) -> dict[str, Any]:
    """One ``enqueue_on_commit`` of ``url`` in a transaction; its outbox row as written (to replay it)."""
    with transaction.atomic():
        tid = enqueue_on_commit(url)
        row = OutboxEntry.objects.filter(task_id=tid).values("namespace", "task_id", "spec", "created_at")[0]
    row["created_at"] = row["created_at"].isoformat()
    return {"id": tid, "state": _state(tid), "outbox": _outbox(), "row": row,
            "stats": runtime().queue().stats()}


def replay_row(row: dict[str, Any]) -> dict[str, Any]:
    """The row ``commit_url`` returned, back in the outbox (a push that arrived, its delete lost), relayed."""
    OutboxEntry.objects.create(**{**row, "created_at": datetime.fromisoformat(row["created_at"])})
    report = relay()
    return {"relay": report.as_dict(), "state": _state(row["task_id"]), "stats": runtime().queue().stats()}


def reset() -> dict[str, Any]:
    """A clean database for the next test (the schema stays)."""
    OutboxEntry.objects.all().delete()
    Order.objects.all().delete()
    User.objects.all().delete()
    return {"ok": True}


if __name__ == "__main__":
    name = sys.argv[1]
    kwargs = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    result = globals()[name](**kwargs)
    print("RESULT " + json.dumps(result, default=str), flush=True)
