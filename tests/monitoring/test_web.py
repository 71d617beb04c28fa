"""``celery-ha web`` as a real process: routes, auth on every page, CSRF-safe actions, loopback Host
check, and one-line errors for bad options."""

from __future__ import annotations

import json
import socket

import pytest
import redis

from celery_ha.proxy import ProxyPool
from celery_ha.state import TaskQueue
from tests.monitoring.webproc import samples, value, web_process
from tests.support.cli import SECRET, assert_one_line_error, run

NS = "webns"
AUTH = ("admin", SECRET)


@pytest.fixture
def crawl(redis_url: str) -> tuple[TaskQueue, ProxyPool]:
    """A small standalone crawl: 3 completed, 2 dead, 4 queued, one banned proxy."""
    q = TaskQueue.from_url(redis_url, NS)
    q.enqueue_many([f"https://user:{SECRET}@example.com/p/{i}" for i in range(9)])
    for i in range(5):
        lease = q.claim_next("w1")
        if i < 3:
            q.complete(lease)
        else:
            q.fail(lease, f"HTTP 404 via http://u:{SECRET}@proxy:1", retry=False)
    pool = ProxyPool.from_url(redis_url, NS)
    pool.add(f"http://u:{SECRET}@127.0.0.2:8001")
    pool.add("http://127.0.0.3:8001")
    pool.ban("127.0.0.3:8001", reason="manual test")
    return q, pool


def test_read_only_server_serves_every_route_and_refuses_actions(redis_url: str, crawl) -> None:
    q, _ = crawl
    with web_process(redis_url, NS) as web:
        assert "no auth, read-only" in web.output[0] and SECRET not in "".join(web.output)
        page = samples(web.get("/metrics").text)
        stats = q.stats()
        for state in ("queued", "dispatched", "running", "delayed", "completed", "dead"):
            assert value(page, "celery_ha_tasks", namespace=NS, state=state) == stats[state]
        assert value(page, "celery_ha_proxy_bans_total", namespace=NS, kind="manual") == 1
        assert web.get("/healthz").json() == {"ok": True, "namespace": NS}
        index = web.get("/")
        assert index.status == 200 and b"/static/app.js" in index.body
        assert "default-src 'self'" in index.headers["Content-Security-Policy"]
        assert web.get("/static/app.js").headers["Content-Type"].startswith("text/javascript")
        assert web.get("/static/../server.py").status == 404
        doc = web.get("/api/dashboard").json()
        assert [t["error"] for t in doc["dead"]] == ["HTTP 404 via http://u:***@proxy:1"] * 2
        assert all(SECRET not in t["url"] for t in doc["dead"]) and SECRET not in json.dumps(doc)
        assert web.get("/api/session").json() == {"actions": False, "user": None, "csrf": None}
        refused = web.request("/api/dead/redrive", method="POST", body=b"{}",
                              headers={"Content-Type": "application/json"})
        assert refused.status == 403 and "--auth" in refused.json()["error"]
        # a page on another origin resolving its own name to 127.0.0.1 (DNS rebinding) is refused
        assert web.get("/api/stats", headers={"Host": "attacker.example:8808"}).status == 421
        assert web.get("/api/stats", headers={"Host": "localhost:1"}).status == 200


def test_api_stats_has_the_document_of_stats_json(redis_url: str, crawl) -> None:
    with web_process(redis_url, NS) as web:
        served = web.get("/api/stats").json()
    printed = run(["--redis-url", redis_url, "-n", NS, "stats", "--json"])
    assert printed.exit_code == 0, printed.output
    assert served == json.loads(printed.stdout)


def test_with_auth_every_page_needs_it_and_actions_need_the_csrf_token(
        redis_url: str, r: redis.Redis, crawl) -> None:
    q, pool = crawl
    with web_process(redis_url, NS, auth=AUTH) as web:
        assert "basic auth, user admin" in web.output[0] and SECRET not in "".join(web.output)
        for path in ("/", "/metrics", "/healthz", "/api/stats", "/api/dashboard", "/static/app.js"):
            res = web.get(path, auth=False)
            assert res.status == 401 and res.headers["WWW-Authenticate"].startswith("Basic"), path
            wrong = {"Authorization": "Basic YWRtaW46d3Jvbmc="}  # admin:wrong
            assert web.get(path, headers=wrong, auth=False).status == 401
            assert web.get(path).status == 200, path
        session = web.get("/api/session").json()
        assert session["actions"] is True and len(session["csrf"]) == 64
        dead_id = q.dead()[0].id
        body = json.dumps({"id": dead_id}).encode()
        json_type = {"Content-Type": "application/json"}
        # a cross-site form post carries the browser's basic auth but no token: refused, nothing moved
        for headers in ({"Content-Type": "application/x-www-form-urlencoded"}, json_type,
                        {**json_type, "X-CSRF-Token": "0" * 64},
                        {**json_type, "X-CSRF-Token": session["csrf"], "Origin": "http://attacker.example"}):
            assert web.request("/api/dead/redrive", method="POST", body=body, headers=headers).status == 403
        assert q.stats()["dead"] == 2
        ok = {**json_type, "X-CSRF-Token": session["csrf"]}
        assert web.request("/api/dead/redrive", method="POST", body=b"{\"id\": 7}", headers=ok).status == 400
        missing = web.request("/api/dead/redrive", method="POST", body=b'{"id": "nope"}', headers=ok)
        assert missing.status == 404
        res = web.request("/api/dead/redrive", method="POST", body=body, headers=ok)
        assert res.json() == {"redriven": 1} and q.get(dead_id).state == "queued"
        res = web.request("/api/dead/redrive", method="POST", body=b'{"all": true}', headers=ok)
        assert res.json() == {"redriven": 1} and q.stats()["dead"] == 0
        res = web.request("/api/proxies/unban", method="POST", body=b'{"id": "127.0.0.3:8001"}', headers=ok)
        assert res.status == 200 and pool.get("127.0.0.3:8001").state == "avail"


@pytest.mark.parametrize("args, says", [
    (["--auth", "admin"], "--auth"),
    (["--auth", f":{SECRET}"], "--auth"),
    (["--auth", "admin:"], "--auth"),
    (["--port", "70000"], "--port"),
    (["--port", "http"], "--port"),
])
def test_bad_options_are_one_line_errors(redis_url: str, args: list[str], says: str) -> None:
    result = run(["--redis-url", redis_url, "web", *args])
    assert_one_line_error(result, code=2, contains=says)


def test_a_busy_port_is_a_one_line_error(redis_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(["--redis-url", redis_url, "web", "--port", str(port)],
                     env={"CELERY_HA_WEB_AUTH": f"admin:{SECRET}"})
    assert_one_line_error(result, code=1, contains=f"cannot listen on 127.0.0.1:{port}")


def test_an_unreachable_redis_is_a_one_line_error() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    result = run(["--redis-url", f"redis://:{SECRET}@127.0.0.1:{port}/0", "web", "--port", "0"])
    assert_one_line_error(result, code=3, contains="cannot reach redis")
