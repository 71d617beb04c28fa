"""Credential masking: what is masked, that nothing else changes, and that it stays linear in time."""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from celery_ha import TaskQueue
from celery_ha.base.masking import mask_prefix, mask_url, secret_query_key
from celery_ha.base.validation import MAX_CHECKPOINT_BYTES
from tests.support.cli import SECRET, assert_one_line_error, run

# ---------------------------------------------------------------- results


@pytest.mark.parametrize(("text", "masked"), [
    ("redis://user:pass@host:6379/0", "redis://user:***@host:6379/0"),
    ("rediss://default:p%40ss@cache.example.com:6380/2", "rediss://default:***@cache.example.com:6380/2"),
    ("redis://:pass@host/0", "redis://***@host/0"),
    ("https://ghp_token123@github.com/org/repo", "https://***@github.com/org/repo"),  # a lone user: a token
    ("redis://u:p:q@h/0", "redis://u:***@h/0"),  # the password runs to the '@'
    ("REDIS://Admin:Pw@HOST/0", "REDIS://Admin:***@HOST/0"),
    ("redis+sentinel://u:p@h:26379", "redis+sentinel://u:***@h:26379"),
    ("1+abc://u:p@h", "1+abc://u:***@h"),  # the scheme starts at the first letter
    ("sentinel://:pw@h1:26379;sentinel://:pw@h2:26379/0", "sentinel://***@h1:26379;sentinel://***@h2:26379/0"),
    ("sentinel://u:pw@h1:26379;sentinel://h2:26379;sentinel://v:pw2@h3",
     "sentinel://u:***@h1:26379;sentinel://h2:26379;sentinel://v:***@h3"),
    ("from redis://a:p1@h1/0 to rediss://b:p2@h2:6380/1 via http://h3/x and ftp://c@h4",
     "from redis://a:***@h1/0 to rediss://b:***@h2:6380/1 via http://h3/x and ftp://***@h4"),
    ('{"url": "http://u:pw@127.0.0.1:8001", "next": "https://x/"}',
     '{"url": "http://u:***@127.0.0.1:8001", "next": "https://x/"}'),
    ("проверка redis://пользователь:пароль@хост/0 ✓", "проверка redis://пользователь:***@хост/0 ✓"),
    ("http://ünï:cødé@例え.jp/パス", "http://ünï:***@例え.jp/パス"),
])
def test_masks_the_password(text: str, masked: str) -> None:
    assert mask_url(text) == masked


@pytest.mark.parametrize("text", [
    "", "plain text", "://", "redis://host:6379/0", "redis://host/0?x=a@b", "http://example.com/a@b",
    "mailto:someone@example.com", "user:pass@host", "redis://u: p@h", "1://u:p@h", "x://u:p\n@h",
    "unix:///tmp/redis.sock?db=1", "sentinel://h1:26379;sentinel://h2:26379/0", "日本語 テキスト",
])
def test_leaves_text_without_credentials_alone(text: str) -> None:
    assert mask_url(text) == text


_REFERENCE = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<cred>[^/?#\s]*)@", re.I)
_REFERENCE_QUERY = re.compile(r"([?&;])([^=&;#?\s/]*)=((?:(?!;[a-z][a-z0-9+.-]*://)[^&#\s])*)", re.I)


def _reference_mask_url(url: str) -> str:
    """The plain (quadratic: a match may start anywhere) form of the rules, which the linear
    implementation must agree with: userinfo up to the authority's last '@', then secret query keys."""

    def repl(match: re.Match[str]) -> str:
        cred = match.group("cred")
        user = cred.split(":", 1)[0] if ":" in cred else ""
        return f"{match.group('scheme')}{user}:***@" if user else f"{match.group('scheme')}***@"

    def query(match: re.Match[str]) -> str:
        sep, key, val = match.groups()
        return f"{sep}{key}=***" if val and secret_query_key(key) else match.group(0)

    if "://" not in url:
        return url
    return _REFERENCE_QUERY.sub(query, _REFERENCE.sub(repl, url))


def test_same_results_as_the_reference_on_random_text() -> None:
    pieces = ["a", "Z", "k", "1", "+", ".", "-", ":", "/", "@", " ", "\n", "ı", "K", "é", "://", "s:p@", "@h",
              "?", "&", ";", "#", "=", "password=", "user=", "pw"]
    rng = random.Random(20240501)
    for _ in range(30_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 24)))
        assert mask_url(text) == _reference_mask_url(text), text


@pytest.mark.parametrize("password", ["p@ssTail-Secret", "p@ss@tail-Secret", "ab:cd@ef", "@lead-Secret",
                                      "tail-Secret@", "x%40y@z-Secret"])
def test_a_password_is_masked_to_the_last_at_sign_as_redis_py_reads_it(password: str) -> None:
    # urllib (and so redis-py) takes the userinfo up to the LAST '@' of the authority.
    for url, user in ((f"redis://:{password}@127.0.0.1:6379/0", None),
                      (f"rediss://admin:{password}@127.0.0.1:6380/0?db=1", "admin")):
        masked = mask_url(url)
        assert "Secret" not in masked and "ab:cd" not in masked, masked
        parts = urlsplit(masked)
        expected = ("127.0.0.1", user or "***", user and "***")
        assert (parts.hostname, parts.username, parts.password) == expected
    assert mask_url(f"see redis://u:{password}@h:1/0 and more") == "see redis://u:***@h:1/0 and more"
    assert mask_prefix(f"redis://:{password}@h/0", 14) == "redis://***"  # cut after an '@' of the password


@pytest.mark.parametrize(("text", "masked"), [
    ("redis://127.0.0.1:6379/0?password=QuerySecret", "redis://127.0.0.1:6379/0?password=***"),
    ("redis://h/0?db=1&username=bob&password=pw&ssl_cert_reqs=none",
     "redis://h/0?db=1&username=***&password=***&ssl_cert_reqs=none"),
    ("sentinel://h1:1?sentinel_password=pw;sentinel://h2:2/0", "sentinel://h1:1?sentinel_password=***;sentinel://h2:2/0"),
    ("redis://h/0?password=a;b#frag", "redis://h/0?password=***#frag"),  # ';' is part of a redis password
    ("redis://h/0?%70assword=pw", "redis://h/0?%70assword=***"),  # parse_qs decodes the key
    ("redis://h/0?PASSWORD=pw", "redis://h/0?PASSWORD=***"),
    ("https://api.example.com/v1?q=shoes&api_key=k123&access_token=t456&page=2",
     "https://api.example.com/v1?q=shoes&api_key=***&access_token=***&page=2"),
    ("error at redis://u:p@h/0?password=x (retrying)", "error at redis://u:***@h/0?password=*** (retrying)"),
])
def test_masks_credential_query_parameters(text: str, masked: str) -> None:
    assert mask_url(text) == masked


@pytest.mark.parametrize("text", [
    "redis://h/0?db=1&socket_timeout=5", "https://shop.example/list?page=2&sort=price", "redis://h/0?password=",
    "a text? password=x without a URL", "https://passage.example/?passage=3",
])
def test_leaves_other_query_parameters_alone(text: str) -> None:
    assert mask_url(text) == text


# ---------------------------------------------------------------- bounded prefixes


def test_mask_prefix_is_mask_url_of_the_prefix_when_nothing_is_cut() -> None:
    text = "see redis://a:pw@h1/0 and http://b:pw@h2/x, ftp://c@h3 then more text after"
    # Cut at whitespace, no credential can be cut (whitespace ends one).
    for limit in [i + 1 for i, c in enumerate(text) if c == " "] + [len(text), len(text) + 10]:
        assert mask_prefix(text, limit) == mask_url(text[:limit]), limit
    assert mask_prefix(text, len(text)) == ("see redis://a:***@h1/0 and http://b:***@h2/x, ftp://***@h3 then "
                                            "more text after")
    assert mask_prefix("", 0) == "" and mask_prefix("abc", 0) == ""
    with pytest.raises(ValueError):
        mask_prefix("abc", -1)


def test_mask_prefix_never_shows_part_of_a_cut_password() -> None:
    for text in (f"error at redis://admin:{SECRET}@h:1/0 (x)", f"ftp://:{SECRET}@h", f"https://{SECRET}@h/",
                 f"sentinel://h1:1;sentinel://u:{SECRET}@h2:2/0"):
        for limit in range(len(text) + 2):
            shown = mask_prefix(text, limit)
            assert SECRET[:2] not in shown, (limit, shown)
            assert len(shown) <= limit + 3  # '***' may stand for fewer characters
        assert mask_prefix(text, len(text)) == mask_url(text)


def test_mask_prefix_masks_a_cut_credential_as_one() -> None:
    assert mask_prefix("redis://user:" + "p" * 5000 + "@h/0", 40) == "redis://user:***"
    assert mask_prefix("x https://tok" + "t" * 100, 12) == "x https://***"
    assert mask_prefix("http://host.example.com/path", 11) == "http://***"  # unknown yet: masked
    assert mask_prefix("redis://u:p@h/0 " + "x" * 100, 20) == "redis://u:***@h/0 xxxx"
    assert mask_prefix("no scheme here " * 10, 20) == "no scheme here no sc"


# ---------------------------------------------------------------- time

def _best(fn: Callable[[str], object], text: str, reps: int, tries: int, give_up: float) -> float:
    """Fastest of ``tries`` timings of ``reps`` calls; stops early once a try takes ``give_up``."""
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        for _ in range(reps):
            fn(text)
        best = min(best, time.perf_counter() - start)
        if best >= give_up:
            break
    return best


def _growth(fn: Callable[[str], object], make: Callable[[int], str], small: int, big: int,
            limit: float) -> float:
    """How much longer ``fn`` takes on ``make(big)`` than on ``make(small)`` (a relative measure)."""
    short, long = make(small), make(big)
    reps = 1
    while _best(fn, short, reps, 1, float("inf")) < 0.003 and reps < 100_000:
        reps *= 4  # enough calls that the small case is well above the timer's resolution
    base = _best(fn, short, reps, 5, float("inf"))
    return _best(fn, long, reps, 3, give_up=base * limit * 2) / base


FAMILIES: dict[str, Callable[[int], str]] = {
    "letters": lambda n: "x" * n,
    "run before ://": lambda n: "a" * n + "://",
    "digits before a scheme": lambda n: "1" * n + "a://u:p@h",
    "open credentials": lambda n: "a://b:" + "c" * n,
    "many ://": lambda n: "a://" * (n // 4),
    "many matches": lambda n: "a://u:p@" * (n // 8),
    "colons": lambda n: "ab://" + "c:" * (n // 2),
    "checkpoint json": lambda n: json.dumps({"blob": "x" * n, "url": "redis://u:p@h/0", "n": [1, 2]}),
    "many @ in an authority": lambda n: "a://" + "@" * n,
    "long authority, no @": lambda n: "a://" + "h" * n + "/x@y",
    "many query keys": lambda n: "a://h/?" + "password=v&" * (n // 11),
    "long query key": lambda n: "a://h/?" + "k" * n,
    "semicolons in a value": lambda n: "a://h/?password=" + ";a" * (n // 2),
}


@pytest.mark.parametrize("make", FAMILIES.values(), ids=FAMILIES.keys())
def test_mask_url_time_grows_linearly(make: Callable[[int], str]) -> None:
    # 20x the input: linear code takes ~20x as long, the quadratic one ~400x. The bound sits between
    # them with room for a loaded machine (allocation and cache effects on 400 KB strings measured up
    # to 80x under load). The small pair first, so a quadratic regression fails in seconds instead of
    # hanging for minutes on 400 KB.
    for small, big in ((2_000, 40_000), (20_000, 400_000)):
        growth = _growth(mask_url, make, small, big, limit=150)
        assert growth < 150, f"{big // small}x the input took {growth:.0f}x as long"


def test_mask_prefix_reads_only_the_prefix() -> None:
    def shown(text: str) -> str:
        return mask_prefix(text, 200)

    for make in (FAMILIES["letters"], FAMILIES["many matches"], FAMILIES["open credentials"]):
        growth = _growth(shown, make, 40_000, 4_000_000, limit=10)
        assert growth < 10, f"100x the input took {growth:.0f}x as long for a 200-character prefix"


# ---------------------------------------------------------------- the CLI on big values


def test_task_with_a_60kb_checkpoint_shows_quickly_and_masked(redis_url: str) -> None:
    q = TaskQueue.from_url(redis_url)
    tid = q.enqueue("https://example.com/big")
    lease = q.claim(tid, "w1")
    checkpoint = {"blob": "x" * 60_000, "cursor": f"redis://u:{SECRET}@h:1/0", "pages": list(range(100))}
    assert 58_000 < len(json.dumps(checkpoint)) < MAX_CHECKPOINT_BYTES  # ~60 KB: legal, near the cap
    q.save_checkpoint(lease, checkpoint)

    table = run(["--redis-url", redis_url, "task", tid])
    assert table.exit_code == 0, table.output
    assert tid in table.stdout and "running" in table.stdout and SECRET not in table.output
    assert "characters in all" in table.stdout and len(table.stdout) < 20_000  # a page, not 60 KB

    data = run(["--redis-url", redis_url, "task", tid, "--json"])
    assert data.exit_code == 0, data.output
    shown = json.loads(data.stdout)["checkpoint"]
    assert shown == {**checkpoint, "cursor": "redis://u:***@h:1/0"}  # in full, masked

    dead = run(["--redis-url", redis_url, "dead", "show", tid])
    assert dead.exit_code == 0 and "is running, not dead" in dead.stderr and SECRET not in dead.output


def test_task_with_a_huge_unknown_id_is_one_short_line(redis_url: str) -> None:
    for task_id in ("y" * 100_000, "a://" * 25_000, f"redis://u:{SECRET}@h/" + "z" * 100_000):
        # Ids are capped (256 characters): a huge one is refused as input, in one short masked line.
        line = assert_one_line_error(run(["--redis-url", redis_url, "task", task_id]), code=1,
                                     contains="task id")
        assert len(line) < 300
