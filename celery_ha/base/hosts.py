"""Host keys: the one normalisation of "which site does this request hit", shared by every layer.

The proxy pool counts its per-domain windows and locks under this key, the fetcher derives it from the
URL it fetches, and the durable state layer's host gate (``state/hosts.py``) queues a task under it, so
a politeness limit set for ``example.com`` means the same host everywhere: the lower-case host name, plus
``:port`` when the port is not the scheme's default. It lives in the lowest layer because the state layer
sits below the proxy pool and must not import it.
"""

from __future__ import annotations

import functools
import re

from celery_ha.base.errors import InvalidInput
from celery_ha.base.masking import mask_url
from celery_ha.base.urls import canonical_host
from celery_ha.base.validation import MAX_URL_BYTES, check_text

# Used with fullmatch (a '$' would also match before a trailing newline), ASCII digits only.
_HOST_RE = re.compile(
    r"(?=.{1,253}\Z)([a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9])?)(\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9])?)*"
)
_IPV4_RE = re.compile(r"([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})")
# A custom host key (``host=`` at enqueue that is not a host name): what may appear in a Redis key name
# and a record's JSON without escaping, and never a '{' or '}' (the keys' hash tag).
_CUSTOM_KEY_RE = re.compile(r"[a-z0-9][a-z0-9._:@~-]{0,199}")
# The enqueue fast path: a lower-case http(s) URL whose authority is a bare host name (no port, no
# user): the host key is that name. Everything else goes through host_of_url's general route.
_SIMPLE_HOST = re.compile(r"https?://([a-z0-9.-]+)(?:[/?#]|\Z)")


def valid_host(host: str) -> bool:
    """A DNS name or a dotted IPv4 address (lower-case)."""
    m = _IPV4_RE.fullmatch(host)
    if m:
        return all(0 <= int(g) <= 255 for g in m.groups())
    return bool(_HOST_RE.fullmatch(host)) and not host.replace(".", "").isdigit()


def normalize_domain(domain: str) -> str:
    """The key a rate window, a lock and a host gate are counted under: lower-case host, plus ``:port``
    if given.

    Accepts a bare host (``example.com``), ``host:port`` or a full http(s) URL (the host of its
    canonical form, ``base/urls.py``).
    """
    if not isinstance(domain, str) or not domain.strip():
        raise InvalidInput("domain must be a non-empty string")
    text = check_text("domain", domain.strip(), MAX_URL_BYTES).lower()
    if "://" in text:  # a URL: its host as canonical_url spells it (base/urls.py), port included
        try:
            text = canonical_host(text)
        except InvalidInput:
            raise InvalidInput(f"bad domain {mask_url(domain)!r}") from None
    host, _, port_text = text.partition(":")
    port = None
    if port_text:
        if not (port_text.isascii() and port_text.isdigit()) or not (1 <= int(port_text) <= 65535):
            raise InvalidInput(f"bad domain {domain!r}: port must be 1-65535")
        port = int(port_text)
    host = host.rstrip(".")
    if not host or not valid_host(host):
        raise InvalidInput(f"bad domain {mask_url(domain)!r}: expected a host name such as example.com")
    return f"{host}:{port}" if port else host


def host_of_url(url: str) -> str:
    """The host key of an http(s) URL: its host, plus the port when it is not the scheme's default
    (``http://a.example:8080/x`` -> ``a.example:8080``, ``https://a.example:443/`` -> ``a.example``).
    InvalidInput for a URL without an http(s) scheme or a host name :func:`normalize_domain` accepts."""
    simple = _SIMPLE_HOST.match(url) if isinstance(url, str) else None
    if simple is not None:
        host = simple.group(1).rstrip(".")
        if host and valid_host(host):
            return host
    try:  # the general route: the host of the URL's canonical form (base/urls.py)
        netloc = canonical_host(url)
    except InvalidInput:
        raise InvalidInput(f"cannot fetch {mask_url(url)!r}: need an http(s) URL with a host") from None
    return normalize_domain(netloc)


@functools.lru_cache(maxsize=65_536)
def bare_host_key(host: str) -> str:
    """The host key of a lower-case bare host name (the authority of a URL with no port and no user:
    enqueue's fast path), memoized, since a crawl's URLs repeat their hosts; '' when it is no host
    name :func:`normalize_domain` would accept."""
    host = host.rstrip(".")
    return host if host and valid_host(host) else ""


def check_host_key(key: object) -> str:
    """A host key given by the caller (``host=`` at enqueue, the hosts CLI): a host name, ``host:port``
    or a URL (normalised as :func:`normalize_domain`), or a custom key of 1-200 characters of lower-case
    letters, digits and ``. _ : @ ~ -`` (a registered domain, a site id, an IP block...)."""
    if not isinstance(key, str) or not key.strip():
        raise InvalidInput(f"host must be a non-empty string, got {key!r}"[:200])
    text = key.strip().lower()
    try:
        return normalize_domain(text)
    except InvalidInput:
        if _CUSTOM_KEY_RE.fullmatch(text):
            return text
        raise InvalidInput(
            f"bad host key {key[:100]!r}: a host name (example.com, example.com:8080) or 1-200 of "
            f"a-z 0-9 . _ : @ ~ -") from None


# ---------------------------------------------------------------------------- host key modes
#: How a namespace derives a task's host key when its enqueue gives no ``host=`` (stored in Redis
#: with the host defaults, so every process of the namespace agrees): ``host`` the URL's host (plus a
#: non-default port), ``registered-domain`` the registered domain of that host (``a.example.co.uk``
#: -> ``example.co.uk``: one gate for a site's subdomains), ``custom`` none (only a task given
#: ``host=`` is gated, under that key).
KEY_MODES = ("host", "registered-domain", "custom")
_MODE_ALIASES = {"domain": "registered-domain", "registered_domain": "registered-domain"}


def check_key_mode(mode: object) -> str:
    """A host key mode given by the caller (one of :data:`KEY_MODES`, or ``domain`` for
    ``registered-domain``), or InvalidInput."""
    text = mode.strip().lower() if isinstance(mode, str) else ""
    text = _MODE_ALIASES.get(text, text)
    if text not in KEY_MODES:
        raise InvalidInput(f"host key mode must be one of {', '.join(KEY_MODES)}, got {mode!r}"[:200])
    return text


@functools.lru_cache(maxsize=1)
def _extractor() -> object:
    """The public suffix list reader: tldextract with the snapshot of the list its release bundles,
    never a download (no suffix list URL, no cache directory), so every process of a release splits
    a host the same way and no worker reaches the network for it. ICANN suffixes only: the private
    section (github.io, blogspot.com...) would split one operator's servers into many gates."""
    import tldextract  # imported on first use: only the registered-domain mode needs it

    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None, include_psl_private_domains=False)


@functools.lru_cache(maxsize=65_536)
def registered_domain(key: str) -> str:
    """The registered domain of a host key (its public suffix plus one label, the port kept):
    ``a.b.example.co.uk:8080`` -> ``example.co.uk:8080``. A host under no listed suffix (``.test``,
    ``.internal``) follows the list's default rule, "*": its last label is the suffix
    (``a.example.test`` -> ``example.test``). An IPv4 address, a single label and a custom key (not
    a host name) are their own domain."""
    host, sep, port = key.rpartition(":") if ":" in key else (key, "", "")
    if not host or _IPV4_RE.fullmatch(host) or not valid_host(host) or "." not in host:
        return key
    parts = _extractor()(host)  # type: ignore[operator]
    if parts.suffix and parts.domain:
        domain = f"{parts.domain}.{parts.suffix}"
    elif parts.suffix:
        domain = parts.suffix  # the host is a public suffix itself
    else:
        domain = ".".join(host.split(".")[-2:])
    return f"{domain}{sep}{port}"


def mode_key(key: str, mode: str) -> str:
    """The gate key of a URL's host key ``key`` under a namespace's key ``mode``: itself (host), its
    registered domain, or '' (custom: a URL's host makes no key; only ``host=`` does)."""
    if not key or mode == "host":
        return key
    if mode == "registered-domain":
        return registered_domain(key)
    return ""
