"""Input checks shared by every layer: refuse bad input before anything is written.

Each rule exists once here (URLs, task names, namespaces, rates, integers, JSON payload caps), so the
queue, the proxy pool, the settings and the CLI can never disagree about what is valid.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import SplitResult, urlsplit

from celery_ha.base.errors import InvalidInput, PayloadTooLarge

MAX_URL_BYTES = 8 * 1024
MAX_META_BYTES = 16 * 1024
MAX_CHECKPOINT_BYTES = 64 * 1024
MAX_ITEM_BYTES = 256 * 1024
MAX_ERROR_CHARS = 2000
#: Deepest nesting of lists/objects in a meta, checkpoint or item: far beyond any real crawl state,
#: and well inside what Python's JSON decoder can read back in a deep call stack.
MAX_JSON_DEPTH = 100
#: Longest task id, worker name or other short label a caller may pass (characters).
MAX_NAME_CHARS = 256
PRIORITY_RANGE = (-1000, 1000)
_TASK_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}")
_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
NAMESPACE_RULE = "1-64 characters of letters, digits, '_', '.', '-'"
_RATE = re.compile(r"\s*([0-9]{1,12})\s*/\s*([0-9]{1,12}(?:\.[0-9]{1,12})?)\s*")
MAX_RATE_WINDOW = 7 * 86400
MAX_RATE_REQUESTS = 10**9
MIN_RATE_WINDOW = 0.001  # a window is counted in whole milliseconds


#: What no stored text may hold: C0/C1 control characters (DEL included) and lone surrogates, which
#: have no UTF-8 form (Redis would get an encoding error instead of a typed refusal).
_UNSAFE_CHAR = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_URL_BAD_CHAR = re.compile(r"[\s\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def shown(value: Any, limit: int = 200) -> str:
    """``repr(value)`` for an error message, cut to ``limit``; safe for any value (a huge integer has
    no repr past 4,300 digits, and a message must never fail to build)."""
    if isinstance(value, int) and not -10**30 < value < 10**30:
        return f"an integer of about {value.bit_length() * 3 // 10} digits"
    try:
        text = repr(value)
    except Exception:  # a caller's object whose __repr__ fails
        text = f"<{type(value).__name__}>"
    return text[:limit]


def _unsafe_char(found: str) -> str:
    """How an error message names a refused character (escaped: never a raw control or surrogate)."""
    return "a lone surrogate" if "\ud800" <= found <= "\udfff" else f"a control character {found!r}"


def utf8_size(what: str, text: str) -> int:
    """``len(text.encode('utf-8'))``, without encoding ASCII text; a lone surrogate is InvalidInput."""
    if text.isascii():
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput(f"{what} contains a lone surrogate (not encodable as UTF-8)") from None


def check_text(name: str, value: Any, cap: int = MAX_NAME_CHARS, *, empty: bool = False) -> str:
    """A string of at most ``cap`` characters (non-empty unless ``empty``) without control characters
    or lone surrogates: task ids, worker names, item keys, proxy sources and the like."""
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string, got {type(value).__name__}")
    if not value and not empty:
        raise InvalidInput(f"{name} must not be empty")
    if len(value) > cap:
        raise InvalidInput(f"{name} is longer than {cap} characters")
    if not (value.isascii() and value.isprintable()):  # C-level: proves the common case clean
        bad = _UNSAFE_CHAR.search(value)
        if bad:
            raise InvalidInput(f"{name} contains {_unsafe_char(bad.group())} at position {bad.start()}")
    return value


#: Longest key of an output item in the sink (characters).
MAX_ITEM_KEY_CHARS = 512


def check_item_key(key: Any) -> str:
    """The sink key of an output item: a clean string of 1-512 characters."""
    return check_text("item key", key, MAX_ITEM_KEY_CHARS)


def clean_message(text: Any, cap: int = MAX_ERROR_CHARS) -> str:
    """Free text recorded for people (an error, a release reason): ``str(text)`` cut to ``cap``
    characters, lone surrogates escaped (``\\ud800``) so it always encodes. Never refuses: a failure
    must be recordable whatever its message says."""
    text = str(text)[:cap]
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")[:cap]
    return text


def check_url(url: Any) -> str:
    """Return ``url`` if it is an absolute http(s) URL with a host and at most 8 KiB, else raise."""
    _checked_parts(url)
    return url


def _checked_parts(url: Any) -> SplitResult:
    """The checks of :func:`check_url`, returning the parsed URL (``base/urls.py``'s canonical_url
    checks a URL with it before canonicalising it)."""
    if not isinstance(url, str):
        raise InvalidInput(f"URL must be a string, got {type(url).__name__}")
    if len(url) > MAX_URL_BYTES or utf8_size("URL", url) > MAX_URL_BYTES:
        raise PayloadTooLarge(f"URL is longer than {MAX_URL_BYTES} bytes")
    bad = _URL_BAD_CHAR.search(url)
    if bad:
        found = bad.group()
        what = "whitespace" if found.isspace() else _unsafe_char(found)
        raise InvalidInput(f"URL contains {what}: {url[:200]!r}")
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
    return parts


def check_task_name(name: Any) -> str:
    if not isinstance(name, str) or not _TASK_NAME.fullmatch(name):
        raise InvalidInput(
            f"task name must be 1-128 characters of letters, digits, '_', '.', ':', '-': {shown(name)}"
        )
    return name


def check_namespace(namespace: Any) -> str:
    """A namespace names Redis keys (``cha:{NAMESPACE}:…``) and broker queues."""
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise InvalidInput(f"namespace must be {NAMESPACE_RULE}: {shown(namespace)}")
    return namespace


def parse_rate(rate: object, what: str = "rate") -> tuple[int, float]:
    """``"5/60"`` or ``(5, 60)`` -> (requests, seconds); both must be positive."""
    if isinstance(rate, str):
        m = _RATE.fullmatch(rate)
        if not m:
            raise InvalidInput(f"bad {what} {shown(rate)}: expected 'N/SECONDS' such as '5/60'")
        n, w = int(m.group(1)), float(m.group(2))
    elif isinstance(rate, (tuple, list)) and len(rate) == 2:
        if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in rate):
            raise InvalidInput(f"bad {what} {shown(rate)}: expected (requests, seconds) as numbers")
        try:
            n, w = int(rate[0]), float(rate[1])
        except (TypeError, ValueError, OverflowError):
            raise InvalidInput(f"bad {what} {shown(rate)}: expected (requests, seconds)") from None
        if n != rate[0]:
            raise InvalidInput(f"bad {what} {shown(rate)}: requests must be an integer")
    else:
        raise InvalidInput(f"bad {what} {shown(rate)}: expected 'N/SECONDS' or (N, SECONDS)")
    if not 1 <= n <= MAX_RATE_REQUESTS or not (MIN_RATE_WINDOW <= w <= MAX_RATE_WINDOW):
        raise InvalidInput(f"bad {what} {shown(rate)}: need 1-{MAX_RATE_REQUESTS} requests per "
                           f"{MIN_RATE_WINDOW}-{MAX_RATE_WINDOW} seconds")
    return n, w


_DURATION = re.compile(r"\s*([0-9]{1,12}(?:\.[0-9]{1,9})?)\s*([smhdw]?)\s*", re.IGNORECASE)
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: Longest age or expiry an operator may give (ten years): a longer one is a typo, not a policy.
MAX_DURATION_SECONDS = 10 * 365 * 86400


def parse_duration(text: object, what: str = "duration") -> float:
    """``"90"``, ``"90s"``, ``"15m"``, ``"6h"``, ``"7d"``, ``"2w"`` (or a number of seconds) -> seconds.
    Operators write ages and expiries in the unit they think in; a number alone means seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return check_number(what, text, 0, MAX_DURATION_SECONDS, unit="seconds")
    m = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if not m:
        raise InvalidInput(f"bad {what} {shown(text)}: expected a number with an optional unit "
                           "s, m, h, d or w, such as '90s', '15m' or '7d'")
    seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2).lower()]
    if seconds > MAX_DURATION_SECONDS:
        raise InvalidInput(f"bad {what} {shown(text)}: at most ten years")
    return seconds


#: Longest lease a caller may ask for (seconds): a week, far beyond any crawl step.
MAX_LEASE_SECONDS = 7 * 86400


def check_number(name: str, value: Any, low: float, high: float, unit: str = "") -> float:
    """A finite real number in [low, high] (a latency, a delay, a TTL); bools, NaN and inf refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{name} must be a number{' of ' + unit if unit else ''}, got {shown(value)}")
    if not low <= value <= high:  # NaN compares false, inf and huge integers fall outside
        raise InvalidInput(f"{name} must be between {low:g} and {high:g}{' ' + unit if unit else ''}, "
                           f"got {shown(value)}")
    return float(value)


def check_seconds(name: str, value: Any, low: float = 0.001, high: float = MAX_LEASE_SECONDS) -> float:
    """A finite number of seconds in [low, high] (a TTL, a wait)."""
    return check_number(name, value, low, high, unit="seconds")


def iter_many(what: str, value: Any) -> Iterator[Any]:
    """An iterator over ``value``, a collection of ``what`` (one str, bytes or dict is refused: it
    would be taken apart character by character, or key by key)."""
    if isinstance(value, (str, bytes, Mapping)):
        raise InvalidInput(f"{what} must be a list, not one {type(value).__name__}")
    try:
        return iter(value)
    except TypeError:
        raise InvalidInput(f"{what} must be a list, got {type(value).__name__}") from None


def check_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{name} must be an integer, got {shown(value)}")
    if not low <= value <= high:
        raise InvalidInput(f"{name} must be between {low} and {high}, got {shown(value)}")
    return value


#: Compact, non-ASCII kept, NaN refused: built once (json.dumps would build one per call).
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def dumps_capped(what: str, value: Any, cap: int, require_object: bool = True) -> str:
    """Compact JSON of ``value`` (dict unless stated), refusing non-JSON data (lone surrogates and
    nesting deeper than :data:`MAX_JSON_DEPTH` included) and oversized payloads."""
    if require_object and not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object (dict), got {type(value).__name__}")
    try:
        text = _ENCODE(value)
    except RecursionError:
        raise InvalidInput(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} is not JSON-serializable: {exc}") from None
    size = utf8_size(what, text)
    if size > cap:
        raise PayloadTooLarge(f"{what} is {size} bytes, over its cap of {cap} bytes")
    # Nesting deeper than MAX_JSON_DEPTH needs more than 2 * MAX_JSON_DEPTH characters and as many
    # opening brackets: two O(1)/C-level tests keep ordinary payloads off the walk below.
    if size > 2 * MAX_JSON_DEPTH and text.count("[") + text.count("{") > MAX_JSON_DEPTH \
            and _deeper_than(value, MAX_JSON_DEPTH):
        raise InvalidInput(f"{what} is nested deeper than {MAX_JSON_DEPTH} levels")
    return text


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether JSON-encodable ``value`` nests lists/objects more than ``limit`` deep (iterative)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in (node.values() if isinstance(node, dict) else node):
            if isinstance(child, (dict, list, tuple)):
                stack.append((child, depth + 1))
    return False
