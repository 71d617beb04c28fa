"""The input rules of celery_ha.base.validation: the enqueue fast path agrees with the reference."""

from __future__ import annotations

import pytest

from celery_ha.base.errors import InvalidInput
from celery_ha.base.validation import (
    check_namespace,
    check_seconds,
    check_task_name,
    check_url,
    parse_rate,
)


@pytest.mark.parametrize("bad", ["fetch_page\n", "", "1abc", "a b", "x" * 129, None, 3])
def test_task_names_are_matched_whole(bad: object) -> None:
    with pytest.raises(InvalidInput):
        check_task_name(bad)


@pytest.mark.parametrize("bad", ["shop\n", "", "a b", "x" * 65, "a*", None])
def test_namespaces_are_matched_whole(bad: object) -> None:
    with pytest.raises(InvalidInput):
        check_namespace(bad)


def test_rates() -> None:
    assert parse_rate("5/60") == (5, 60.0) and parse_rate((2, 1.5)) == (2, 1.5)
    for bad in ("5", "0/60", "5/0", "5/60\n7", (1.5, 3), "a/b"):
        with pytest.raises(InvalidInput):
            parse_rate(bad)


@pytest.mark.parametrize("url", ["http://exa\x00mple.com/x", "http://example.com/a\x07b", "http://e.com/\x7f"])
def test_control_characters_are_refused_in_urls(url: str) -> None:
    with pytest.raises(InvalidInput, match="control character"):
        check_url(url)


@pytest.mark.parametrize("bad", [-100, 0, float("nan"), float("inf"), True, "5", 10**9])
def test_seconds_must_be_positive_finite_and_bounded(bad: object) -> None:
    with pytest.raises(InvalidInput):
        check_seconds("ttl", bad)
