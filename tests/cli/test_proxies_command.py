"""``celery-ha proxies``: add, import, list, ban, unban, remove, check — credentials always masked."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from celery_ha.demo.proxy_farm import ProxyFarm
from celery_ha.proxy import ProxyPool
from tests.support.cli import SECRET, assert_one_line_error, run


def cli(redis_url: str, *args: str, input: str | None = None):
    return run(["--redis-url", redis_url, *args], input=input)


@pytest.fixture
def pool(redis_url: str) -> ProxyPool:
    return ProxyPool.from_url(redis_url)


@pytest.fixture
def check_site() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/health"
    server.shutdown()
    server.server_close()


def test_add_list_ban_unban_remove(redis_url: str, pool: ProxyPool) -> None:
    result = cli(redis_url, "proxies", "add", f"http://user:{SECRET}@127.0.0.1:8001", "http://127.0.0.1:8002")
    assert result.exit_code == 0, result.output
    assert "added 2" in result.stdout and SECRET not in result.output
    listing = cli(redis_url, "proxies", "list")
    assert listing.exit_code == 0 and "127.0.0.1:8001" in listing.stdout and "user:***@" in listing.stdout
    assert SECRET not in listing.output
    data = json.loads(cli(redis_url, "proxies", "list", "--json").stdout)
    assert {p["id"] for p in data} == {"127.0.0.1:8001", "127.0.0.1:8002"} and SECRET not in json.dumps(data)

    banned = cli(redis_url, "proxies", "ban", f"http://user:{SECRET}@127.0.0.1:8001", "--seconds", "60")
    assert banned.exit_code == 0 and "banned for 60s" in banned.stdout and SECRET not in banned.output
    assert pool.get("127.0.0.1:8001").state == "tban"
    assert "1 proxies" in cli(redis_url, "proxies", "list", "--state", "tban").stdout
    assert cli(redis_url, "proxies", "ban", "127.0.0.1:8002").exit_code == 0
    assert pool.get("127.0.0.1:8002").state == "pban"
    unbanned = cli(redis_url, "proxies", "unban", "127.0.0.1:8001")
    assert unbanned.exit_code == 0 and "available again" in unbanned.stdout
    assert pool.get("127.0.0.1:8001").state == "avail"
    assert cli(redis_url, "proxies", "remove", "127.0.0.1:8002").exit_code == 0
    assert [p.id for p in pool.list()] == ["127.0.0.1:8001"]


def test_import_file_and_stdin(redis_url: str, pool: ProxyPool, tmp_path: Path) -> None:
    listing = tmp_path / "proxies.txt"
    listing.write_text(f"# farm\nhttp://a:{SECRET}@127.0.0.2:9001\n\nhttp://127.0.0.3:9002\n")
    result = cli(redis_url, "proxies", "import", str(listing), "--source", "farm")
    assert result.exit_code == 0 and "added 2" in result.stdout, result.output
    result = cli(redis_url, "proxies", "import", "-", "--verify", input="http://127.0.0.4:9003\n")
    assert result.exit_code == 0, result.output
    states = {p.id: (p.state, p.source) for p in pool.list()}
    assert states["127.0.0.2:9001"] == ("avail", "farm") and states["127.0.0.4:9003"][0] == "new"


def test_bad_proxy_input_is_one_line_and_adds_nothing(redis_url: str, pool: ProxyPool) -> None:
    line = assert_one_line_error(cli(redis_url, "proxies", "import", "-",
                                     input=f"http://127.0.0.1:1\nftp://u:{SECRET}@h:2\n"), code=1)
    assert "line 2" in line
    assert_one_line_error(cli(redis_url, "proxies", "add", "http://127.0.0.1:1", "not-a-proxy"), code=1)
    assert pool.list() == []
    assert_one_line_error(cli(redis_url, "proxies", "import", "-", input="# only comments\n"), code=2)
    assert_one_line_error(cli(redis_url, "proxies", "ban", "127.0.0.9:1"), code=1, contains="unknown proxy")
    assert_one_line_error(cli(redis_url, "proxies", "unban", f"http://u:{SECRET}@127.0.0.9:1"), code=1)
    assert_one_line_error(cli(redis_url, "proxies", "remove", "127.0.0.9:1"), code=1)
    assert_one_line_error(cli(redis_url, "proxies", "check"), code=2, contains="--url")


def test_check_restores_good_and_demotes_dead_proxies(redis_url: str, pool: ProxyPool,
                                                      check_site: str) -> None:
    farm = ProxyFarm(2, first=20, auth=("demo", SECRET)).start()
    try:
        farm.proxies[1].alive = False
        cli(redis_url, "proxies", "add", "--verify", *farm.urls)
        assert {p.state for p in pool.list()} == {"new"}
        result = cli(redis_url, "proxies", "check", "--url", check_site, "--timeout", "2", "--json")
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        assert report["checked"] == 2
        assert report["restored"] == [farm.proxies[0].id]
        assert list(report["demoted"]) == [farm.proxies[1].id]
        assert farm.proxies[0].requests == 1  # really went through the proxy (with its credentials)
        again = cli(redis_url, "proxies", "check", "--url", check_site)
        assert again.exit_code == 0 and "checked 0" in again.stdout
    finally:
        farm.stop()


def test_empty_list(redis_url: str) -> None:
    result = cli(redis_url, "proxies", "list")
    assert result.exit_code == 0 and "no proxies" in result.stdout
