"""Input checks shared by every layer: refuse bad input before anything is written.

Each rule exists once here (URLs, task names, namespaces, rates, integers, JSON payload caps), so the
queue, the proxy pool, the settings and the CLI can never disagree about what is valid.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from celery_ha.base.errors import InvalidInput, PayloadTooLarge

MAX_URL_BYTES = 8 * 1024
MAX_META_BYTES = 16 * 1024
MAX_CHECKPOINT_BYTES = 64 * 1024
MAX_ITEM_BYTES = 256 * 1024
MAX_ERROR_CHARS = 2000
PRIORITY_RANGE = (-1000, 1000)
_TASK_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}")
_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
NAMESPACE_RULE = "1-64 characters of letters, digits, '_', '.', '-'"
_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)\s*")
MAX_RATE_WINDOW = 7 * 86400
_DEFAULT_PORTS = {"http": 80, "https": 443}


def check_url(url: Any) -> str:
    """Return ``url`` if it is an absolute http(s) URL with a host and at most 8 KiB, else raise."""
    if not isinstance(url, str):
        raise InvalidInput(f"URL must be a string, got {type(url).__name__}")
    if len(url.encode("utf-8")) > MAX_URL_BYTES:
        raise PayloadTooLarge(f"URL is longer than {MAX_URL_BYTES} bytes")
    if any(c.isspace() for c in url):
        raise InvalidInput(f"URL contains whitespace: {url[:200]!r}")
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise InvalidInput(f"URL contains a control character: {url[:200]!r}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidInput(f"malformed URL {url[:200]!r}: {exc}") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise InvalidInput(f"only http and https URLs can be crawled, got {url[:200]!r}")
    if not parts.hostname:
        raise InvalidInput(f"URL has no host: {url[:200]!r}")
    del port
    return url


def canonical_url(url: str) -> str:
    """A stable form of a URL for deduplication.

    Scheme and host are lower-cased, default ports and fragments dropped, an empty path becomes ``/``
    and query parameters are sorted, so trivially different spellings of one page dedup together.
    """
    parts = urlsplit(check_url(url))
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    netloc = host if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"
    if parts.username is not None:
        cred = parts.username + (f":{parts.password}" if parts.password is not None else "")
        netloc = f"{cred}@{netloc}"
    query = urlencode(sorted(parse_qsl(parts.query, keep_blank_values=True)))
    return urlunsplit((scheme, netloc, parts.path or "/", query, ""))


# The common URL shape (lower-case http(s) scheme and host, no port, user, query or fragment, a path of
# plain characters) for which check_url() is known to pass and canonical_url() to be the URL itself, or
# the URL plus "/" when it has no path: the per-task fast path of enqueue. Everything else takes the
# general route through check_url() and canonical_url() above, which stay the reference (a test
# checks that both agree).
_SIMPLE_URL = re.compile(r"https?://[a-z0-9.-]+(/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*)?")


def simple_canonical_url(url: object) -> str | None:
    """canonical_url(url) when ``url`` has the simple shape above (so it is valid), else None."""
    if isinstance(url, str) and len(url) <= MAX_URL_BYTES:  # the pattern is ASCII: chars == bytes
        match = _SIMPLE_URL.fullmatch(url)
        if match:
            return url if match.group(1) else url + "/"
    return None


def check_task_name(name: Any) -> str:
    if not isinstance(name, str) or not _TASK_NAME.fullmatch(name):
        raise InvalidInput(
            f"task name must be 1-128 characters of letters, digits, '_', '.', ':', '-': {name!r}"
        )
    return name


def check_namespace(namespace: Any) -> str:
    """A namespace names Redis keys (``cha:{NAMESPACE}:…``) and broker queues."""
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise InvalidInput(f"namespace must be {NAMESPACE_RULE}: {namespace!r}")
    return namespace


def parse_rate(rate: object, what: str = "rate") -> tuple[int, float]:
    """``"5/60"`` or ``(5, 60)`` -> (requests, seconds); both must be positive."""
    if isinstance(rate, str):
        m = _RATE.fullmatch(rate)
        if not m:
            raise InvalidInput(f"bad {what} {rate!r}: expected 'N/SECONDS' such as '5/60'")
        n, w = int(m.group(1)), float(m.group(2))
    elif isinstance(rate, (tuple, list)) and len(rate) == 2:
        try:
            n, w = int(rate[0]), float(rate[1])
        except (TypeError, ValueError):
            raise InvalidInput(f"bad {what} {rate!r}: expected (requests, seconds)") from None
        if n != rate[0]:
            raise InvalidInput(f"bad {what} {rate!r}: requests must be an integer")
    else:
        raise InvalidInput(f"bad {what} {rate!r}: expected 'N/SECONDS' or (N, SECONDS)")
    if n < 1 or not (0 < w <= MAX_RATE_WINDOW):
        raise InvalidInput(f"bad {what} {rate!r}: need at least 1 request per 0-{MAX_RATE_WINDOW} seconds")
    return n, w


#: Longest lease a caller may ask for (seconds): a week, far beyond any crawl step.
MAX_LEASE_SECONDS = 7 * 86400


def check_seconds(name: str, value: Any, low: float = 0.001, high: float = MAX_LEASE_SECONDS) -> float:
    """A finite number of seconds in [low, high] (a TTL, a wait); bools and NaN/inf refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or not low <= value <= high:
        raise InvalidInput(f"{name} must be between {low:g} and {high:g} seconds, got {value!r}")
    return float(value)


def check_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise InvalidInput(f"{name} must be between {low} and {high}, got {value}")
    return value


#: Compact, non-ASCII kept, NaN refused: built once (json.dumps would build one per call).
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def dumps_capped(what: str, value: Any, cap: int, require_object: bool = True) -> str:
    """Compact JSON of ``value`` (dict unless stated), refusing non-JSON data and oversized payloads."""
    if require_object and not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object (dict), got {type(value).__name__}")
    try:
        text = _ENCODE(value)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} is not JSON-serializable: {exc}") from None
    size = len(text.encode("utf-8"))
    if size > cap:
        raise PayloadTooLarge(f"{what} is {size} bytes, over its cap of {cap} bytes")
    return text
