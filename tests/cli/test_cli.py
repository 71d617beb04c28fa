"""The CLI contract that holds for every command: --help, one-line errors, masked credentials."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from celery_ha import TaskQueue
from celery_ha.cli import main
from tests.support.cli import SECRET, assert_one_line_error, run


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for name, cmd in group.commands.items():
        out.append((*prefix, name))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, (*prefix, name))
    return out


ALL = _commands(main)
CONTRACT = {"demo", "up", "enqueue", "stats", "task", "dead", "dead list", "dead show", "dead redrive",
            "proxies", "proxies add", "proxies import", "proxies list", "proxies ban", "proxies unban",
            "proxies check", "export", "workers", "purge", "redis", "redis status", "redis stop"}


def test_every_contract_command_exists() -> None:
    assert CONTRACT <= {" ".join(c) for c in ALL}


@pytest.mark.parametrize("path", ALL, ids=[" ".join(c) for c in ALL])
def test_every_command_has_help(path: tuple[str, ...]) -> None:
    result = run([*path, "--help"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Usage: ")
    assert len(result.stdout.splitlines()) >= 4  # a description, not just a usage line


@pytest.mark.parametrize("args", [[], ["dead"], ["proxies"], ["redis"]])
def test_bare_group_shows_its_help(args: list[str]) -> None:
    result = run(args)
    assert result.exit_code == 2 and result.stdout.startswith("Usage: ") and "Commands:" in result.stdout


def test_top_level_help_and_version() -> None:
    assert run(["--help"]).exit_code == 0
    result = run(["--version"])
    assert result.exit_code == 0 and "celery-ha" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["no-such-command"],
        ["stats", "--bogus"],
        ["enqueue"],
        ["enqueue", "--priority", "5000", "https://example.com/"],
        ["enqueue", "--meta", "{not json", "https://example.com/"],
        ["enqueue", "--meta", "[1, 2]", "https://example.com/"],
        ["enqueue", "--task", "bad name!", "https://example.com/"],
        ["enqueue", "-f", "/no/such/file.txt"],
        ["dead", "redrive"],
        ["dead", "nope"],
        ["export", "--format", "xml"],
        ["export", "--columns", "a,b"],
        ["export", "--format", "csv", "--columns", "a,,b"],
        ["stats", "--json", "--watch"],
        ["--namespace", "bad ns!", "stats"],
        ["proxies", "add"],
        ["proxies", "list", "--state", "weird"],
        ["task"],
    ],
)
def test_bad_usage_is_one_line(args: list[str], redis_url: str) -> None:
    result = run(["--redis-url", redis_url, *args])
    assert_one_line_error(result, code=2)


def test_unreachable_redis_is_one_masked_line() -> None:
    url = f"redis://admin:{SECRET}@127.0.0.1:1/0"
    for args in (["stats"], ["task", "abc"], ["dead", "list"], ["proxies", "list"], ["workers"],
                 ["export"], ["purge", "--yes"], ["enqueue", "https://example.com/"]):
        line = assert_one_line_error(run(["--redis-url", url, *args]), code=3, contains="cannot reach redis")
        assert "admin:***@127.0.0.1:1" in line


def test_malformed_redis_url_is_one_line() -> None:
    line = assert_one_line_error(run(["--redis-url", f"http://u:{SECRET}@host/0", "stats"]), code=1)
    assert "unsupported Redis URL" in line
    # A database that is no number: redis-py would quietly use database 0.
    line = assert_one_line_error(run(["--redis-url", f"redis://u:{SECRET}@127.0.0.1:1/abc", "stats"]), code=1)
    assert "must be a number" in line and SECRET not in line


def test_bad_environment_setting_is_one_line(redis_url: str) -> None:
    result = run(["--redis-url", redis_url, "stats"], env={"CELERY_HA_LEASE_TTL": "soon"})
    assert_one_line_error(result, code=1, contains="CELERY_HA_LEASE_TTL")


def test_redis_url_from_environment(redis_url: str) -> None:
    result = run(["stats", "--json"], env={"CELERY_HA_REDIS_URL": redis_url})
    assert result.exit_code == 0, result.output


def test_unexpected_errors_are_one_line_too(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    from celery_ha.state import TaskQueue

    def boom(self: TaskQueue) -> dict[str, int]:
        raise RuntimeError(f"kaputt redis://x:{SECRET}@h:1\nsecond line")

    TaskQueue.from_url(redis_url, namespace="default").enqueue("http://example.com/")  # a namespace in use
    monkeypatch.setattr(TaskQueue, "stats", boom)
    line = assert_one_line_error(run(["--redis-url", redis_url, "stats"]), code=1, contains="RuntimeError")
    assert "x:***@h:1" in line


def test_refused_credentials_are_named_as_such(r, redis_url: str) -> None:
    """A wrong password is not 'cannot reach Redis': the operator must fix credentials, not the network."""
    r.execute_command("ACL", "SETUSER", "crawler", "on", ">right-password", "~*", "&*", "+@all")
    try:
        url = redis_url.replace("redis://", f"redis://crawler:{SECRET}@", 1)
        line = assert_one_line_error(run(["--redis-url", url, "stats"]), code=3,
                                     contains="refused the credentials")
        assert "crawler:***@" in line
    finally:
        r.execute_command("ACL", "DELUSER", "crawler")


def test_settings_repr_masks_every_secret() -> None:
    from celery_ha.base.settings import Settings

    values = {"REDIS_URL": f"redis://u:{SECRET}@h:1/0", "SENTINEL_PASSWORD": SECRET,
              "FLOWER_AUTH": f"admin:{SECRET}"}
    shown = repr(Settings.from_overrides(values, env={}))
    assert SECRET not in shown and "u:***@h:1" in shown


def test_a_reader_that_goes_away_ends_a_command_quietly(redis_url: str) -> None:
    """`celery-ha stats | head -0`: the pipe's reader is gone before the command writes; it stops with
    exit 0 and nothing on stderr, as `export` does."""
    TaskQueue.from_url(redis_url).enqueue("https://example.com/")
    for args in (["stats"], ["workers"], ["dead", "list"]):
        proc = subprocess.Popen([sys.executable, "-m", "celery_ha.cli", "--redis-url", redis_url, *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None
        proc.stdout.close()  # the reader is gone
        _, err = proc.communicate(timeout=60)
        assert (proc.returncode, err.decode()) == (0, ""), args
