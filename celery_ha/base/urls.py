"""URL canonicalisation: the one spelling of a URL that dedup ids, host keys and proxy domains derive from.

The work is w3lib's ``canonicalize_url`` (the canonicaliser Scrapy's request fingerprints use, kept up
to date with the URL standard: IDNA hosts, percent-encoding case, dot segments, IPv6 literals, sorted
query arguments), plus what it leaves to the caller: the scheme's default port dropped, and the
namespace's :class:`UrlRules` (fragments kept or dropped, tracking parameters stripped). The path's
case is always kept (``/A`` and ``/a`` are different pages on most servers).

A dedup id is a digest of this form, so every process of a namespace must canonicalise alike: the
rules a namespace uses are recorded in Redis by the state layer (``state/url_rules.py``), and the
w3lib release is pinned to one minor series in pyproject.toml (a release that spells URLs
differently changes the ids of the URLs it respells).
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from w3lib.url import canonicalize_url

from celery_ha.base.errors import InvalidInput
from celery_ha.base.validation import MAX_URL_BYTES, _checked_parts

_DEFAULT_PORTS = {"http": "80", "https": "443"}

#: Query parameters stripped by default: campaign and click identifiers that analytics tools append
#: to links, which name the visit, not the page (Google, Meta, Microsoft, Mailchimp, HubSpot, Marketo,
#: Yandex, TikTok, X, LinkedIn, Instagram). ``*`` matches any run of characters; names are compared
#: case-insensitively.
TRACKING_PARAMS: tuple[str, ...] = (
    "utm_*", "gclid", "gclsrc", "dclid", "gbraid", "wbraid", "_ga", "_gl", "fbclid", "msclkid",
    "mc_cid", "mc_eid", "_hsenc", "_hsmi", "mkt_tok", "yclid", "ttclid", "twclid", "li_fat_id", "igshid",
)
_PARAM_PATTERN = re.compile(r"[A-Za-z0-9_.*\[\]-]{1,100}")
MAX_STRIP_PARAMS = 200


def check_param_patterns(patterns: object) -> tuple[str, ...]:
    """Query-parameter names to strip (``*`` wildcards allowed), lower-cased, as a sorted tuple."""
    if isinstance(patterns, str):
        patterns = [p.strip() for p in patterns.split(",")]
    if not isinstance(patterns, (list, tuple, set, frozenset)):
        raise InvalidInput(f"strip_params must be a list of parameter names, got {type(patterns).__name__}")
    names: set[str] = set()
    for pattern in patterns:
        text = pattern.strip() if isinstance(pattern, str) else None
        if text == "":
            continue
        if text is None or not _PARAM_PATTERN.fullmatch(text):
            raise InvalidInput(f"bad query parameter name {str(pattern)[:100]!r}: 1-100 of letters, "
                               "digits, '_', '.', '-', '[', ']' and the wildcard '*'")
        names.add(text.lower())
    if len(names) > MAX_STRIP_PARAMS:
        raise InvalidInput(f"at most {MAX_STRIP_PARAMS} query parameter names to strip")
    return tuple(sorted(names))


@dataclass(frozen=True)
class UrlRules:
    """How a namespace canonicalises URLs beyond the fixed normalisation (see the module docstring).

    ``keep_fragments``: ``#section`` stays part of the URL (single-page sites that route by fragment);
    by default it is dropped, as browsers never send it. ``strip_params``: query parameters removed
    before dedup (default :data:`TRACKING_PARAMS`; empty = keep every parameter).
    """

    keep_fragments: bool = False
    strip_params: tuple[str, ...] = tuple(sorted(TRACKING_PARAMS))

    def __post_init__(self) -> None:
        if not isinstance(self.keep_fragments, bool):
            raise InvalidInput(f"keep_fragments must be a bool, got {type(self.keep_fragments).__name__}")
        object.__setattr__(self, "strip_params", check_param_patterns(self.strip_params))
        object.__setattr__(self, "_exact", frozenset(p for p in self.strip_params if "*" not in p))
        object.__setattr__(self, "_globs", tuple(p for p in self.strip_params if "*" in p))

    def strips(self, name: str) -> bool:
        """Whether query parameter ``name`` (as it appears in the URL) is stripped."""
        low = name.lower()
        return low in self._exact or any(fnmatch.fnmatchcase(low, g) for g in self._globs)  # type: ignore[attr-defined]

    def to_json(self) -> str:
        """The rules as the compact JSON recorded in Redis (``state/url_rules.py``)."""
        return json.dumps({"fragments": self.keep_fragments, "strip": list(self.strip_params)},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> UrlRules:
        data = json.loads(text)
        return cls(bool(data.get("fragments")), tuple(data.get("strip", ())))

    def describe(self) -> str:
        """One line for an error message or the docs."""
        strip = ",".join(self.strip_params) or "none"
        return f"fragments {'kept' if self.keep_fragments else 'dropped'}, stripped parameters: {strip}"


DEFAULT_RULES = UrlRules()


def canonical_url(url: str, rules: UrlRules = DEFAULT_RULES) -> str:
    """The canonical form of ``url`` under ``rules``; InvalidInput (as :func:`check_url`) for a URL
    that is not an absolute http(s) URL with a host.

    ``HTTP://Example.COM:80/a/./b?utm_source=x&b=2&a=1#top`` -> ``http://example.com/a/b?a=1&b=2``.
    """
    _checked_parts(url)
    try:
        text = canonicalize_url(url, keep_blank_values=True, keep_fragments=rules.keep_fragments)
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:  # a host IDNA cannot encode, say
        raise InvalidInput(f"malformed URL {url[:200]!r}: {exc}") from None
    scheme, netloc, path, query, fragment = parts
    if port is not None and str(port) == _DEFAULT_PORTS.get(scheme):
        netloc = netloc[: netloc.rfind(":")]
    if query and rules.strip_params:
        query = "&".join(p for p in query.split("&") if not rules.strips(p.partition("=")[0]))
    return urlunsplit((scheme, netloc, path, query, fragment))


def canonical_host(url: str) -> str:
    """The authority of ``url``'s canonical form without user info: the lower-case (IDNA) host, plus
    ``:port`` when not the scheme's default. The host key (``base/hosts.py``) is made from it."""
    return authority(canonical_url(url))


def authority(canonical: str) -> str:
    """The host[:port] of a URL :func:`canonical_url` returned (its user info left out)."""
    netloc = canonical.split("/", 3)[2]
    return netloc[netloc.rfind("@") + 1:]


# The common URL shape (lower-case http(s) scheme and host, no port, user, query or fragment, a path of
# plain characters without percent escapes, dot segments or a trailing ';', which w3lib drops as an
# empty path parameter) whose canonical form is known without parsing: the URL itself, or the URL plus
# "/" when it has no path. The per-task fast path of enqueue; everything else takes canonical_url()
# above, which stays the reference (a test checks that both agree).
_SIMPLE_URL = re.compile(r"https?://[a-z0-9.-]+(/[A-Za-z0-9._~!$&'()*+,;=:@/-]*)?")


def simple_canonical_url(url: object) -> str | None:
    """canonical_url(url) when ``url`` has the simple shape above (so it is valid), else None; the
    same under any :class:`UrlRules` (the shape has no query and no fragment)."""
    if isinstance(url, str) and len(url) <= MAX_URL_BYTES:  # the pattern is ASCII: chars == bytes
        match = _SIMPLE_URL.fullmatch(url)
        if match:
            if match.lastindex is None:  # no path
                return url + "/"
            # C-level tests instead of a lookahead: "/." is rare outside dot segments (a path with
            # /.well-known takes the general route, which gives the same answer).
            if "/." not in url and url[-1] != ";":
                return url
    return None
