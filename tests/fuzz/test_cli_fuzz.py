"""Hostile input through ``celery-ha enqueue``: a one-line error, and nothing written."""

from __future__ import annotations

import pytest
import redis

from tests.fuzz.hostile import snapshot
from tests.support.cli import assert_one_line_error, run

DEEP = '{"a": ' + "[" * 2000 + "]" * 2000 + "}"


@pytest.mark.parametrize("args", [
    ["enqueue", "https://example.com/ok", "https://example.com/a\x00b"],
    ["enqueue", "https://example.com/ok", "https://example.com/a\x07b"],
    ["enqueue", "https://example.com/ok", "https://example.com/\x7f"],
    ["enqueue", "https://example.com/ok", "https://example.com/\x85"],
    ["enqueue", "--meta", DEEP, "https://example.com/ok"],
    ["enqueue", "--meta", '{"a": ' + "[" * 150 + "]" * 150 + "}", "https://example.com/ok"],
    ["enqueue", "--meta", '"\\ud800"', "https://example.com/ok"],
    ["enqueue", "--meta", '{"a": "\\ud800"}', "https://example.com/ok"],
    ["enqueue", "--meta", '{"\\udfff": 1}', "https://example.com/ok"],
], ids=["nul", "bel", "del", "nel", "meta-2000-deep", "meta-150-deep", "meta-surrogate-string",
        "meta-surrogate-value", "meta-surrogate-key"])
def test_enqueue_refuses_hostile_input_in_one_line(redis_url: str, args: list[str]) -> None:
    raw = redis.Redis.from_url(redis_url)
    raw.set("marker", "1")
    before = snapshot(raw)
    result = run(["--redis-url", redis_url, "--namespace", "fz", *args])
    assert_one_line_error(result)
    assert snapshot(raw) == before
    raw.close()
