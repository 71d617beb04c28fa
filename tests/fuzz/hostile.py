"""Hypothesis strategies for hostile input, and the check every fuzz example makes.

The contract under test (README): every error a caller can provoke is a :class:`CeleryHAError`
(``InvalidInput`` is also a ``ValueError``), and a refused call writes nothing. :func:`attempt` runs a
call and asserts exactly that against a byte-exact snapshot of the Redis database.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import redis
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st

from celery_ha.base.errors import CeleryHAError, NoProxyAvailable
from celery_ha.base.validation import (
    MAX_CHECKPOINT_BYTES,
    MAX_ITEM_KEY_CHARS,
    MAX_JSON_DEPTH,
    MAX_META_BYTES,
    MAX_NAME_CHARS,
    MAX_URL_BYTES,
)

#: Deterministic (derandomized, no example database), so a run never depends on an earlier one.
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


def nested(depth: int, leaf: Any = 1, kind: str = "list") -> Any:
    """``leaf`` inside ``depth`` lists (or one-key objects), built without recursion."""
    value = leaf
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


DEPTHS = st.sampled_from([MAX_JSON_DEPTH - 2, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 999, 1001, 2000, 5000])
deep = st.builds(nested, DEPTHS, st.just(1), st.sampled_from(["list", "dict"]))

#: Characters no stored text may hold, and ones that are fine but unusual.
BAD_CHARS = ["\ud800", "\udfff", "\x00", "\x07", "\n", "\t", "\x1f", "\x7f", "\x85", "\x9f"]
surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=())
any_char = st.characters(exclude_categories=())  # every code point, surrogates included
hostile_text = st.one_of(
    st.sampled_from([*BAD_CHARS, "", " ", "é", "\u2028", "\ufeff", "😀"]),
    st.text(any_char, max_size=40),
    st.builds(lambda a, c, b: a + c + b, st.text(max_size=8), st.sampled_from(BAD_CHARS),
              st.text(max_size=8)),
    st.builds(lambda n, c: c * n, st.sampled_from([MAX_NAME_CHARS, MAX_NAME_CHARS + 1,
                                                   MAX_ITEM_KEY_CHARS, MAX_ITEM_KEY_CHARS + 1]),
              st.sampled_from(["a", "é"])),
)

#: Numbers and other non-strings: every type a caller might pass by mistake.
WRONG = [None, b"x", b"", 0, -1, 1, 2**31, 2**63, 2**64 + 1, 10**400, 1.5, -0.0, math.nan, math.inf,
         -math.inf, 5.8e14, True, False, [], ["a"], {}, {"a": 1}, ("a", "b"), {1, 2}, object()]
wrong = st.sampled_from(WRONG)
numbers = st.one_of(st.sampled_from(WRONG), st.integers(), st.floats(allow_nan=True, allow_infinity=True))


def _url_near_cap(pad: int, ch: str) -> str:
    head = "http://example.com/"
    return head + ch * ((MAX_URL_BYTES - len(head)) // len(ch.encode()) + pad)


GOOD_URLS = ["http://example.com/a", "https://example.com", "HTTPS://Example.COM:443/x?b=2&a=1#f",
             "http://[::1]:8080/p", "http://例え.jp/パス"]
hostile_url = st.one_of(
    st.sampled_from(GOOD_URLS),
    st.builds(lambda c: f"http://example.com/a{c}b", st.sampled_from([*BAD_CHARS, " ", "\u3000"])),
    st.builds(lambda s: "http://example.com/" + s, st.text(any_char, max_size=30)),
    st.builds(_url_near_cap, st.sampled_from([-1, 0, 1]), st.sampled_from(["a", "é", "😀"])),
    st.sampled_from(["", "example.com", "ftp://example.com/", "http://", "http://[::1/", "http://h:99999/",
                     "http://h:-1/", "http://[v1.x]/", "http:///path", "javascript:alert(1)"]),
    hostile_text, wrong,
)

#: JSON-ish dicts: fine ones, oversized, deep, non-JSON values, surrogates in keys and values.
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(any_char, max_size=10),
                      st.sampled_from([b"x", object(), 10**5000, {1, 2}, ("t", 1)]))
hostile_dict = st.one_of(
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.dictionaries(st.one_of(st.text(any_char, max_size=5), st.integers(), st.none()), json_leaf,
                    max_size=3),
    st.builds(lambda d: {"deep": d}, deep),
    st.builds(lambda n: {"big": "x" * n}, st.sampled_from(
        [MAX_META_BYTES - 20, MAX_META_BYTES + 1, MAX_CHECKPOINT_BYTES - 20, MAX_CHECKPOINT_BYTES + 1])),
    st.builds(lambda s: {"s": s}, surrogate), st.builds(lambda s: {s: 1}, surrogate),
)
hostile_json = st.one_of(hostile_dict, deep, wrong, hostile_text)


def snapshot(raw: redis.Redis) -> dict[bytes, tuple[bytes | None, bool]]:
    """Every key's serialized value (DUMP) and whether it has an expiry."""
    return {k: (raw.dump(k), raw.pttl(k) >= 0) for k in raw.scan_iter(count=1000)}


def attempt(raw: redis.Redis, call: Callable[[], Any], *, ignore: tuple[bytes, ...] = ()) -> bool:
    """Run ``call``: True when it succeeds; False when it raised a CeleryHAError and left Redis
    unchanged (keys in ``ignore`` may change on an operational refusal, e.g. a counter). Any other
    exception propagates and fails the example."""
    before = snapshot(raw)
    try:
        call()
    except CeleryHAError as exc:
        after = snapshot(raw)
        if isinstance(exc, NoProxyAvailable):
            for key in ignore:
                before.pop(key, None)
                after.pop(key, None)
        assert after == before, f"{type(exc).__name__} ({exc}) but Redis changed"
        str(exc).encode("utf-8")  # a message is printable: never a raw lone surrogate
        event(f"refused: {type(exc).__name__}")
        return False
    event("accepted")
    return True
