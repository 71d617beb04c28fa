"""The input rules of celery_ha.base.validation: the enqueue fast path agrees with the reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_ha.base.errors import InvalidInput
from celery_ha.base.validation import (
    canonical_url,
    check_namespace,
    check_seconds,
    check_task_name,
    check_url,
    parse_rate,
    simple_canonical_url,
)

_PATH = st.text(alphabet="abcXYZ019._~!$&'()*+,;=:@%/-", max_size=40)
_HOST = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?(\.[a-z]{2,6}){0,2}", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(scheme=st.sampled_from(["http", "https", "HTTP", "ftp"]), host=_HOST, path=_PATH,
       tail=st.sampled_from(["", "?b=2&a=1", "#frag", ":8080", ""]))
def test_fast_path_agrees_with_check_url_and_canonical_url(scheme: str, host: str, path: str,
                                                          tail: str) -> None:
    url = f"{scheme}://{host}{'/' + path if path else ''}{tail}"
    fast = simple_canonical_url(url)
    if fast is None:
        return  # not the simple shape: the general route decides
    assert check_url(url) == url
    assert fast == canonical_url(url)


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
