"""``celery-ha web``'s exposure rules as real processes: Redis credentials never printed (in the forms
redis-py accepts), no listening beyond loopback without a login, a Host check always on (decided on the
address actually bound), and the free-text reasons of the dashboard masked."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from urllib.parse import quote, urlsplit

import pytest
import redis

from celery_ha.monitoring.auth import basic_header
from celery_ha.monitoring.dashboard import Reader, dashboard, stats_snapshot
from celery_ha.proxy import ProxyPool
from celery_ha.state import TaskQueue
from celery_ha.state.pause import pause
from tests.monitoring.webproc import Web, web_process
from tests.support.cli import SECRET, assert_one_line_error, run

NS = "webexposure"
AUTH = ("admin", SECRET)


def status(web: Web, host: str, *, login: bool = False) -> int:
    """The status of GET /api/stats sent with this ``Host`` header, over a raw socket (urllib would
    put its own Host)."""
    parts = urlsplit(web.url)
    extra = f"Authorization: {basic_header(*AUTH)}\r\n" if login else ""
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(f"GET /api/stats HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n".encode())
        head = sock.recv(64)
    return int(head.split(b" ", 2)[1])


@pytest.fixture
def acl_user(r: redis.Redis) -> tuple[str, str]:
    """A Redis ACL user whose password holds an '@' (and the test SECRET), removed afterwards."""
    user, password = f"webmask{os.getpid()}", f"p@ss-{SECRET}"
    r.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all")
    yield user, password
    r.execute_command("ACL", "DELUSER", user)


def test_redis_credentials_never_show_in_the_forms_redis_py_accepts(redis_url: str, acl_user) -> None:
    user, password = acl_user
    where = urlsplit(redis_url).netloc
    for url, shown in ((f"redis://{where}/0?username={user}&password={quote(password)}",
                        f"redis://{where}/0?username=***&password=***"),
                       (f"redis://{user}:{password}@{where}/0", f"redis://{user}:***@{where}/0")):
        with web_process(url, NS) as web:
            assert f"Redis {shown})" in web.output[0] and SECRET not in "".join(web.output)
            assert web.get("/healthz").status == 200  # the credentials did work
    for url in (f"redis://{where}/0?username={user}&password=wrong@{SECRET}",
                f"redis://{user}:wrong@{SECRET}@{where}/0"):
        assert_one_line_error(run(["--redis-url", url, "web", "--port", "0"]), code=3,
                              contains="refused the credentials")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", ""])
def test_listening_beyond_loopback_without_a_login_is_refused(redis_url: str, host: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CELERY_HA_WEB_AUTH"}
    # A process (not click's runner): a regression must fail, not serve for ever.
    argv = [sys.executable, "-m", "celery_ha.cli", "--redis-url", redis_url, "web", "--host", host,
            "--port", "0"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("Error: ") and "--auth" in done.stderr
    assert "--insecure-no-auth" in done.stderr


def test_the_explicit_opt_out_serves_without_a_login_but_keeps_the_host_check(redis_url: str) -> None:
    with web_process(redis_url, NS, "--host", "0.0.0.0", "--insecure-no-auth") as web:
        assert any("Warning" in line and "--insecure-no-auth" in line for line in web.output), web.output
        port = urlsplit(web.url).port
        web.url = f"http://127.0.0.1:{port}"
        assert status(web, f"127.0.0.1:{port}") == 200 and status(web, f"192.0.2.7:{port}") == 200
        for hostile in (f"attacker.example:{port}", "web", f"0.0.0.0:{port}", "", f"evil@127.0.0.1:{port}"):
            assert status(web, hostile) == 421, hostile


def test_the_compose_command_needs_the_login_and_answers_its_service_name(redis_url: str) -> None:
    with web_process(redis_url, NS, "--host", "0.0.0.0", "--allowed-hosts", "web", auth=AUTH) as web:
        assert not any("Warning" in line for line in web.output)
        web.url = f"http://127.0.0.1:{urlsplit(web.url).port}"
        assert status(web, "web:8808", login=True) == 200 and status(web, "web:8808") == 401
        assert status(web, "attacker.example:8808", login=True) == 421
    bad = run(["--redis-url", redis_url, "web", "--allowed-hosts", "web,evil/x"])
    assert_one_line_error(bad, code=2, contains="--allowed-hosts")


@pytest.mark.parametrize("host", ["127.1", "0x7f000001", "::ffff:127.0.0.1"])
def test_loopback_written_another_way_is_loopback(redis_url: str, host: str) -> None:
    if ":" in host and not socket.has_ipv6:
        pytest.skip("no IPv6 sockets here")
    with web_process(redis_url, NS, "--host", host) as web:  # no login needed: it is loopback
        assert not any("Warning" in line for line in web.output)
        port = urlsplit(web.url).port
        assert status(web, f"127.0.0.1:{port}") == 200 and status(web, f"localhost:{port}") == 200
        assert status(web, f"attacker.example:{port}") == 421 and status(web, f"192.0.2.7:{port}") == 421


def test_pause_ban_and_block_reasons_are_masked_where_the_web_shows_them(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    q = TaskQueue(client, NS, host_gate=True)
    q.enqueue("https://shop.example/a")
    pool = ProxyPool(client, NS)
    pool.add("http://127.0.0.3:8001")
    reason = f"moved to redis://admin:{SECRET}@new:6379/0?password={SECRET}"
    pool.ban("127.0.0.3:8001", reason=reason)
    q.hosts.block("shop.example", 60, reason)
    pause(client, NS, reason)
    reader = Reader(client, q, pool, 30)
    shown = "moved to redis://admin:***@new:6379/0?password=***"
    for doc in (dashboard(reader), stats_snapshot(reader)):
        assert SECRET not in json.dumps(doc) and shown in json.dumps(doc)
    doc = dashboard(reader)
    assert doc["stats"]["paused"]["reason"] == shown
    assert shown in doc["proxies"][0]["ban_reason"] and shown in doc["hosts"]["top"][0]["block_reason"]
    assert client.hget(q.keys.meta, "paused_reason") == reason  # Redis keeps what was typed
