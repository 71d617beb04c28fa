"""URL canonicalisation (celery_ha.base.urls): w3lib's rules plus the namespace's options, one function
for dedup ids, host keys and proxy domains, and ids unchanged for URLs that were already canonical."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_ha.base.errors import ConfigurationError, InvalidInput
from celery_ha.base.hosts import host_of_url, normalize_domain
from celery_ha.base.settings import Settings
from celery_ha.base.urls import (
    DEFAULT_RULES,
    TRACKING_PARAMS,
    UrlRules,
    canonical_url,
    simple_canonical_url,
)
from celery_ha.base.validation import check_url
from celery_ha.state.ids import task_id_for

_PATH = st.text(alphabet="abcXYZ019._~!$&'()*+,;=:@%/-", max_size=40)
_HOST = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?(\.[a-z]{2,6}){0,2}", fullmatch=True)


@settings(max_examples=400, deadline=None)
@given(scheme=st.sampled_from(["http", "https", "HTTP", "ftp"]), host=_HOST, path=_PATH,
       tail=st.sampled_from(["", "?b=2&a=1", "#frag", ":8080", "", "/..", "/./x", ";", "/x;"]))
def test_fast_path_agrees_with_check_url_and_canonical_url(scheme: str, host: str, path: str,
                                                          tail: str) -> None:
    url = f"{scheme}://{host}{'/' + path if path else ''}{tail}"
    fast = simple_canonical_url(url)
    if fast is None:
        return  # not the simple shape: the general route decides
    assert check_url(url) == url
    assert fast == canonical_url(url) == canonical_url(url, UrlRules(True, ()))


def _legacy_canonical(url: str) -> str:
    """The hand-written canonicaliser this module replaced (scheme and host lower-cased, default port
    and fragment dropped, empty path '/', query sorted through parse_qsl/urlencode): the reference
    for "ids of URLs already canonical do not change"."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    port = parts.port
    netloc = host if port is None or port == {"http": 80, "https": 443}[parts.scheme.lower()] \
        else f"{host}:{port}"
    query = urlencode(sorted(parse_qsl(parts.query, keep_blank_values=True)))
    return urlunsplit((parts.scheme.lower(), netloc, parts.path or "/", query, ""))


_SEGMENT = st.text(alphabet="abcXYZ019_~-!$'()*+,;=:@", min_size=1, max_size=8)
_WORD = st.text(alphabet="abcxyz019_-", min_size=1, max_size=6)


@settings(max_examples=400, deadline=None)
@given(scheme=st.sampled_from(["http", "https"]), host=_HOST,
       port=st.sampled_from(["", ":8080", ":81"]), segments=st.lists(_SEGMENT, max_size=4),
       slash=st.booleans(), query=st.lists(st.tuples(_WORD, _WORD), max_size=4))
def test_ids_of_urls_already_canonical_are_unchanged(scheme: str, host: str, port: str,
                                                     segments: list[str], slash: bool,
                                                     query: list[tuple[str, str]]) -> None:
    """A URL the old canonicaliser left as it was (lower-case, sorted query, no fragment, no default
    port, no percent escapes) keeps its spelling, so its dedup id is what it was: a namespace written
    before the change finds its finished URLs as duplicates."""
    path = "/" + "/".join(segments) + ("/" if slash and segments else "")
    text = urlencode(sorted(query))
    url = f"{scheme}://{host}{port}{path}" + (f"?{text}" if text else "")
    if _legacy_canonical(url) != url:
        return
    last = path[path.rfind("/"):]
    if last.endswith(";") and ";" not in last[:-1]:  # the one respelling: an empty ';' parameter
        assert canonical_url(url) == url.replace(path, path[:-1], 1)
        return
    assert canonical_url(url) == url
    assert task_id_for("fetch_page", url) == task_id_for("fetch_page", _legacy_canonical(url))


@pytest.mark.parametrize(("url", "canonical"), [
    ("http://A.test/x?utm_source=a&b=1#f", "http://a.test/x?b=1"),
    ("HTTPS://Shop.Example:443/Shoes/Red?gclid=1&fbclid=2&UTM_Medium=m&size=9",
     "https://shop.example/Shoes/Red?size=9"),  # path case kept, names compared case-insensitively
    ("http://a.test:80", "http://a.test/"),
    ("http://a.test:8080/a/./b/../c", "http://a.test:8080/a/c"),  # dot segments resolved
    ("http://a.test/%7euser/a%2fb", "http://a.test/~user/a%2Fb"),  # escapes normalised
    ("http://Bücher.DE/é?q=é", "http://xn--bcher-kva.de/%C3%A9?q=%C3%A9"),  # IDNA host, UTF-8
    ("http://a.test/x?b=2&a=1&a=0&utm_id=", "http://a.test/x?a=0&a=1&b=2"),
    ("http://a.test/x?utm_source=a", "http://a.test/x"),
])
def test_canonical_forms_under_the_default_rules(url: str, canonical: str) -> None:
    assert canonical_url(url) == canonical


def test_options_keep_fragments_and_choose_the_stripped_parameters() -> None:
    url = "http://A.test/x?utm_source=a&ref=t&b=1#Top"
    assert canonical_url(url, UrlRules(keep_fragments=True)) == "http://a.test/x?b=1&ref=t#Top"
    assert canonical_url(url, UrlRules(strip_params=())) == "http://a.test/x?b=1&ref=t&utm_source=a"
    assert canonical_url(url, UrlRules(strip_params=("ref", "utm_*"))) == "http://a.test/x?b=1"
    assert set(DEFAULT_RULES.strip_params) == set(TRACKING_PARAMS)


def test_bad_urls_and_bad_rules_are_refused_with_one_line() -> None:
    for bad in ("ftp://a.test/x", "http:///x", "http://a.test:99999/", "http://a b/", 3):
        with pytest.raises(InvalidInput):
            canonical_url(bad)  # type: ignore[arg-type]
    for bad_rules in (["utm_{x}"], [""*101 + "x"*101], "a b", [3]):
        with pytest.raises(InvalidInput):
            UrlRules(strip_params=bad_rules)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        UrlRules(keep_fragments="yes")  # type: ignore[arg-type]


def test_host_keys_and_proxy_domains_come_from_the_canonical_form() -> None:
    assert host_of_url("http://Bücher.DE:80/x") == "xn--bcher-kva.de"
    assert host_of_url("https://User:pw@A.Test:443/x") == "a.test"
    assert host_of_url("http://A.test:8080/x?utm_source=1") == "a.test:8080"
    assert normalize_domain("HTTPS://Shop.Example:443/any") == "shop.example"
    assert normalize_domain("http://bücher.de/") == host_of_url("http://bücher.de/")
    with pytest.raises(InvalidInput):
        host_of_url("ftp://a.test/x")


def test_settings_carry_the_rules() -> None:
    assert Settings.from_env({}).url_rules == DEFAULT_RULES
    custom = Settings.from_env({"CELERY_HA_URL_KEEP_FRAGMENTS": "1",
                                "CELERY_HA_URL_STRIP_PARAMS": "utm_*, Ref"}).url_rules
    assert custom == UrlRules(True, ("ref", "utm_*"))
    assert Settings.from_env({"CELERY_HA_URL_STRIP_PARAMS": "none"}).url_rules.strip_params == ()
    with pytest.raises(ConfigurationError, match="CELERY_HA_URL_STRIP_PARAMS"):
        Settings.from_env({"CELERY_HA_URL_STRIP_PARAMS": "utm source"})
