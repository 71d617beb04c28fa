"""Every float option of the CLI refuses ``nan`` and ``inf`` as bad usage: exit 2, one line naming the
option (click's FloatRange lets NaN through its bounds: ``stats --watch --interval nan`` used to end
in "unexpected ValueError", exit 1)."""

from __future__ import annotations

import pytest
import redis

from celery_ha import TaskQueue
from tests.support.cli import assert_one_line_error, run

CASES = [
    (["stats", "--watch", "--interval", "nan", "--updates", "2"], "--interval"),
    (["stats", "--watch", "--interval", "NaN", "--updates", "2"], "--interval"),
    (["hosts", "block", "a.example", "--seconds", "nan"], "--seconds"),
    (["proxies", "add", "http://127.0.0.1:1", "--ttl", "inf"], "--ttl"),
    (["proxies", "add", "http://127.0.0.1:1", "--ttl", "nan"], "--ttl"),
    (["proxies", "ban", "127.0.0.1:1", "--seconds", "nan"], "--seconds"),
    (["proxies", "ban", "127.0.0.1:1", "--seconds", "inf"], "--seconds"),
    (["proxies", "check", "--url", "http://127.0.0.1:1/", "--timeout", "nan"], "--timeout"),
    (["workers", "--max-age", "nan"], "--max-age"),
    (["workers", "--max-age", "inf"], "--max-age"),
]


@pytest.mark.parametrize(("args", "option"), CASES, ids=lambda a: " ".join(a) if isinstance(a, list) else a)
def test_a_non_finite_number_is_a_usage_error(redis_url: str, r: redis.Redis, args: list[str],
                                              option: str) -> None:
    TaskQueue.from_url(redis_url, namespace="shop").enqueue("https://a.example/1")
    before = set(r.keys("*"))
    line = assert_one_line_error(run(["--redis-url", redis_url, "-n", "shop", *args]), code=2,
                                 contains=f"Invalid value for '{option}'")
    assert "not a finite number" in line
    assert set(r.keys("*")) == before


def test_finite_values_still_work(redis_url: str) -> None:
    TaskQueue.from_url(redis_url, namespace="shop").enqueue("https://a.example/1")
    result = run(["--redis-url", redis_url, "-n", "shop", "stats", "--watch", "--interval", "0.1",
                  "--updates", "2"])
    assert result.exit_code == 0, result.output
    result = run(["--redis-url", redis_url, "-n", "shop", "hosts", "block", "a.example", "--seconds", "1.5"])
    assert result.exit_code == 0 and "blocked until" in result.stdout, result.output
