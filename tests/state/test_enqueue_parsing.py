"""Enqueue parses each URL once (issue 15, the million-URL backlog).

Why: on `celery-ha enqueue -f` of a million URLs the client's CPU, not Redis, set the pace, and most
of it went to parsing every URL that is not of the simple shape (a port, a query) three times:
check_url in the CLI, check_url in build_row, and canonical_url, which checked it again before
parsing it. The counts below are of real ``urlsplit`` calls (the function is wrapped, not replaced);
the rows themselves must be exactly what the reference functions give.
"""

from __future__ import annotations

from pathlib import Path
from urllib import parse

import pytest

import celery_ha.base.validation as validation
from celery_ha.base.errors import InvalidInput
from celery_ha.base.urls import canonical_url
from celery_ha.state.enqueue_args import RowDefaults, build_rows
from celery_ha.state.ids import dedup_id
from celery_ha.state.records import TaskInfo
from tests.support.cli import run

DEFAULTS = RowDefaults("fetch_page", 0, True, 3, 3, 65536)
GENERAL = [f"http://127.0.0.1:8123/case/{i}?b=2&a={i}" for i in range(50)] + \
          [f"HTTPS://Example.COM:443/x/{i}#frag" for i in range(50)]


@pytest.fixture
def splits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []

    def counting(url: str, *args: object, **kw: object) -> parse.SplitResult:
        seen.append(url)
        return parse.urlsplit(url, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(validation, "urlsplit", counting)
    return seen


def test_rows_of_general_urls_parse_each_url_once(splits: list[str]) -> None:
    rows = build_rows(GENERAL, DEFAULTS)
    assert len(splits) == len(GENERAL)  # was 3 per URL
    for url, row in zip(GENERAL, rows, strict=True):
        assert row[0] == dedup_id("fetch_page", canonical_url(url))
        assert TaskInfo.parse(row[0], '{"s":"q"}\n' + row[6]).url == url  # its payload: the URL alone


def test_rows_without_dedup_still_check_the_url(splits: list[str]) -> None:
    rows = build_rows([{"url": u, "dedup": False} for u in GENERAL], DEFAULTS)
    assert len(splits) == len(GENERAL) and all(row[2] == "0" for row in rows)
    for bad in ("ftp://example.com:21/x", "http://:80/x", "http://example.com:99999/x"):
        with pytest.raises(InvalidInput):
            build_rows([{"url": bad, "dedup": False}], DEFAULTS)
        with pytest.raises(InvalidInput):
            build_rows([bad], DEFAULTS)


def test_cli_checks_simple_urls_without_parsing_them(redis_url: str, tmp_path: Path,
                                                     splits: list[str]) -> None:
    listing = tmp_path / "urls.txt"
    simple = [f"https://example.com/case/{i}" for i in range(100)]
    listing.write_text("\n".join(simple + GENERAL[:10]) + "\n")
    result = run(["--redis-url", redis_url, "enqueue", "-f", str(listing)])
    assert result.exit_code == 0, result.output
    assert "queued 110 new task(s), 0 duplicate(s)" in result.stdout
    # The ten general URLs: once in the CLI's check, once for their row; the simple ones never.
    assert sorted(splits) == sorted(GENERAL[:10] * 2)


def test_cli_still_names_the_line_of_a_bad_url(redis_url: str, tmp_path: Path) -> None:
    listing = tmp_path / "urls.txt"
    listing.write_text("# seeds\nhttps://example.com/1\n\nhttp://example.com:99999/x\n")
    result = run(["--redis-url", redis_url, "enqueue", "-f", str(listing), "https://example.com/arg"])
    assert result.exit_code != 0
    assert f"{listing} line 4: malformed URL" in result.stderr
    result = run(["--redis-url", redis_url, "enqueue", "https://example.com/a", "ftp://example.com/b"])
    assert result.exit_code != 0 and "argument 2: only http and https" in result.stderr
