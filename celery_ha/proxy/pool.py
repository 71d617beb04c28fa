"""The centralized proxy pool: every worker borrows from and returns to the same Redis state.

Why central: per-worker proxy lists let five machines hit one site through one IP at once, and a proxy
one worker found dead stays in use everywhere else. Here the lock per proxy × domain, the rate window,
the bans and the scores live in Redis and change only inside Lua scripts (one round trip each for
acquire and release), timed by the Redis clock so workers' clocks never matter.

Zones (see ``docs/proxy_pool.md``): available (``av``, ranked by score), in use (``iu``, leases with an
expiry, emptied by the reaper when a borrower dies), new (``new``, waiting for a first health check),
temporarily banned (``tb``, score = unban time) and permanently banned (``pb``).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import random
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from celery_ha.base.errors import InvalidInput, NoProxyAvailable
from celery_ha.base.settings import Settings
from celery_ha.proxy.keys import ProxyKeys
from celery_ha.proxy.scoring import LUA_CONSTANTS
from celery_ha.proxy.validation import ProxySpec, normalize_domain, parse_proxy_url, parse_rate
from celery_ha.redisio.client import redis_client
from celery_ha.redisio.scripts import ScriptSet
from celery_ha.redisio.urls import mask_url

_NAMESPACE_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_TOKENS = itertools.count()
_TOKEN_PREFIX = [0, ""]  # (pid, random prefix): re-drawn after a fork so children never share tokens


def _token() -> str:
    """A unique lease token without a syscall per call (os.urandom is slow in sandboxes)."""
    if _TOKEN_PREFIX[0] != os.getpid():
        _TOKEN_PREFIX[0], _TOKEN_PREFIX[1] = os.getpid(), secrets.token_hex(6)
    return f"{_TOKEN_PREFIX[1]}{next(_TOKENS):x}"


_SCORE_ARG = " ".join(repr(float(c)) for c in LUA_CONSTANTS)
OUTCOMES = ("ok", "permanent", "blocked", "server", "transport", "aborted", "unused")
BLOCK_STATUSES = frozenset({401, 403, 429})
PERMANENT_STATUSES = frozenset({404, 410})
ZONES = {"avail": "av", "new": "new", "tban": "tb", "pban": "pb"}


def outcome_for(ok: bool | None, status: int | None) -> str:
    """Map the simple ``ok``/``status`` form of release onto an outcome name."""
    if status in PERMANENT_STATUSES:
        return "permanent"
    if ok:
        return "ok"
    if status in BLOCK_STATUSES:
        return "blocked"
    if status is not None and status >= 500:
        return "server"
    if status is None or status == 0 or status == 407:  # 407: the proxy refused us, not the site
        return "transport"
    return "blocked" if ok is False else "ok"


@dataclass
class PoolConfig:
    """Knobs of the pool. Times are seconds. Defaults follow the seed article (5 requests / 60 s)."""

    rate: tuple[int, float] = (5, 60.0)  # per proxy × domain; CELERY_HA_PROXY_RATE
    domain_rates: dict[str, tuple[int, float]] = field(default_factory=dict)  # CELERY_HA_PROXY_DOMAIN_RATES
    domain_budgets: dict[str, tuple[int, float]] = field(default_factory=dict)  # across all proxies
    lock_ttl: float = 30.0  # lease of one borrowed proxy × domain (SET NX PX)
    window_margin: float = 0.0  # extra seconds added to every window (clock/latency slack)
    max_fails: int = 3  # consecutive transport failures before a temporary ban
    ban_base: float = 60.0  # first temporary ban; doubles per ban, jittered ±25 %
    ban_cap: float = 3600.0
    max_temp_bans: int = 5  # the next ban after this many is permanent
    block_ban_base: float = 60.0  # per-domain cool-down after a block (401/403/429/captcha)
    block_ban_cap: float = 3600.0

    def __post_init__(self) -> None:
        self.rate = parse_rate(self.rate, "proxy rate")
        self.domain_rates = {
            normalize_domain(d): parse_rate(r, f"rate for {d}") for d, r in dict(self.domain_rates).items()
        }
        self.domain_budgets = {
            normalize_domain(d): parse_rate(r, f"budget for {d}")
            for d, r in dict(self.domain_budgets).items()
        }
        for name in ("lock_ttl", "ban_base", "ban_cap", "block_ban_base", "block_ban_cap"):
            if not float(getattr(self, name)) > 0:
                raise InvalidInput(f"{name} must be > 0")
        if self.window_margin < 0 or self.max_fails < 1 or self.max_temp_bans < 0:
            raise InvalidInput("window_margin must be >= 0, max_fails >= 1, max_temp_bans >= 0")
        self._release_cfg = " ".join(
            str(int(v))
            for v in (
                self.max_fails,
                self.ban_base * 1000,
                self.ban_cap * 1000,
                self.max_temp_bans,
                self.block_ban_base * 1000,
                self.block_ban_cap * 1000,
            )
        )

    @classmethod
    def from_env(cls, **overrides: Any) -> PoolConfig:
        """Defaults from the settings: ``CELERY_HA_PROXY_RATE`` and ``CELERY_HA_PROXY_DOMAIN_RATES``
        (``"example.com=2/10,shop.example=10/60"``)."""
        settings = Settings.from_env()
        values: dict[str, Any] = {"rate": settings.proxy_rate,
                                  "domain_rates": dict(settings.proxy_domain_rates)}
        values.update(overrides)
        return cls(**values)


@dataclass(frozen=True)
class ProxyLease:
    """One borrowed proxy × domain. Pass it back to :meth:`ProxyPool.release` exactly once.

    ``url`` carries the credentials (requests needs them); it is excluded from ``repr``.
    """

    proxy_id: str
    domain: str
    token: str
    url: str = field(repr=False)
    worker: str = ""
    acquired_at_ms: int = 0
    expires_at_ms: int = 0

    @property
    def masked_url(self) -> str:
        return mask_url(self.url)

    @property
    def proxies(self) -> dict[str, str]:
        """The ``proxies=`` mapping for requests."""
        return {"http": self.url, "https": self.url}

    def __repr__(self) -> str:
        return (
            f"ProxyLease(proxy_id={self.proxy_id!r}, domain={self.domain!r}, url={self.masked_url!r}, "
            f"worker={self.worker!r}, expires_at_ms={self.expires_at_ms})"
        )


@dataclass(frozen=True)
class ProxyInfo:
    """A proxy as shown to people (CLI ``proxies list``): credentials always masked."""

    id: str
    url: str  # masked
    state: str
    source: str
    score: float
    success: float  # decayed successes / results, without the prior
    latency_ms: int  # decayed average, -1 = unknown
    ok: int
    transport_errors: int
    blocked: int
    server_errors: int
    borrowed: int
    ban_until_ms: int
    expires_at_ms: int
    last_used_by: str
    last_used_at_ms: int
    ban_reason: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class ProxyPool:
    """Client of the pool stored under ``cha:{namespace}:px:`` in Redis. Thread-safe (redis-py pool)."""

    SCRIPT_DIR = Path(__file__).parent

    def __init__(
        self, client: redis.Redis, namespace: str = "default", config: PoolConfig | None = None
    ) -> None:
        if not isinstance(namespace, str) or not _NAMESPACE_RE.fullmatch(namespace):
            raise InvalidInput(f"bad namespace {namespace!r}: 1-64 letters, digits, '_', '.', '-'")
        self.client = client
        self.namespace = namespace
        self.config = config or PoolConfig.from_env()
        self.prefix = ProxyKeys(namespace).prefix
        self.avail_key = self.prefix + "av"
        self.scripts = ScriptSet(client, self.SCRIPT_DIR)

    @classmethod
    def from_url(
        cls, url: str, namespace: str = "default", config: PoolConfig | None = None, **overrides: Any
    ) -> ProxyPool:
        """A pool on the Redis at ``url``; config defaults come from the environment."""
        if config is None:
            config = PoolConfig.from_env(**overrides)
        elif overrides:
            raise InvalidInput("pass either config or keyword overrides, not both")
        return cls(redis_client(url), namespace, config)

    def __repr__(self) -> str:
        kw = self.client.connection_pool.connection_kwargs
        where = f"{kw.get('host', kw.get('path', '?'))}:{kw.get('port', '')}/{kw.get('db', 0)}"
        return f"ProxyPool(namespace={self.namespace!r}, redis={where!r})"

    # ------------------------------------------------------------------ adding and removing proxies
    def add(
        self,
        url: str,
        *,
        source: str = "static",
        ttl: float | None = None,
        verify: bool = False,
        group: str | None = None,
        session: str = "",
    ) -> str:
        """Add (or refresh) one proxy; returns its id (``host:port``). Raises InvalidInput, writing nothing.

        ``ttl`` (seconds) is the proxy's lifetime at its provider; ``verify=True`` keeps it out of rotation
        until a health check passes (free lists); ``group`` ties it to a shared concurrency cap.
        """
        spec = parse_proxy_url(url, session=session)
        self.add_specs([spec], source=source, ttl=ttl, verify=verify, group=group)
        return spec.id

    def add_many(
        self, urls: Iterable[str], *, source: str = "static", ttl: float | None = None, verify: bool = False
    ) -> dict[str, int]:
        """Add many proxies atomically: all are validated first, so one bad URL writes nothing."""
        specs = [parse_proxy_url(u) for u in urls]
        return self.add_specs(specs, source=source, ttl=ttl, verify=verify)

    def add_specs(
        self,
        specs: Iterable[ProxySpec],
        *,
        source: str = "static",
        ttl: float | None = None,
        verify: bool = False,
        group: str | None = None,
        group_cap: int | None = None,
        ttls: Mapping[str, float] | None = None,
    ) -> dict[str, int]:
        """Add validated specs in one script. ``ttls`` gives a per-id lifetime (API providers)."""
        if not isinstance(source, str) or not source or len(source) > 32:
            raise InvalidInput("source must be a short non-empty string")
        if ttl is not None and not ttl > 0:
            raise InvalidInput("ttl must be > 0 seconds")
        if group_cap is not None and (group is None or group_cap < 1):
            raise InvalidInput("group_cap needs a group and must be >= 1")
        items = []
        for spec in specs:
            life = (ttls or {}).get(spec.id, ttl)
            item: dict[str, Any] = {
                "id": spec.id,
                "url": spec.url,
                "masked": spec.masked,
                "scheme": spec.scheme,
                "host": spec.host,
                "port": spec.port,
                "user": spec.username,
                "source": source,
                "ttl_ms": int(life * 1000) if life else 0,
                "verify": bool(verify),
            }
            if group:
                item["group"] = group
            items.append(item)
        if not items:
            return {"added": 0, "updated": 0, "skipped": 0}
        caps = {group: int(group_cap)} if group and group_cap else {}
        added, updated, skipped = self.scripts.add(
            keys=[self.avail_key], args=[self.prefix, json.dumps(items), json.dumps(caps), _SCORE_ARG]
        )
        return {"added": int(added), "updated": int(updated), "skipped": int(skipped)}

    def remove(self, proxy: str) -> bool:
        """Forget a proxy (by id or URL)."""
        return bool(self.scripts.remove(keys=[self.avail_key], args=[self.prefix, self.resolve(proxy)]))

    def ban(self, proxy: str, seconds: float | None = None, reason: str = "manual") -> str:
        """Ban by hand: for ``seconds``, or permanently when None. Returns the new state."""
        if seconds is not None and not seconds > 0:
            raise InvalidInput("ban seconds must be > 0 (omit for a permanent ban)")
        pid = self.resolve(proxy)
        state = self.scripts.ban(
            keys=[self.avail_key],
            args=[self.prefix, pid, int(seconds * 1000) if seconds else 0, reason[:200]],
        )
        if not state:
            raise InvalidInput(f"unknown proxy {pid!r}")
        return str(state)

    def unban(self, proxy: str) -> float:
        """Lift every ban and failure count of a proxy; returns its score in the available zone."""
        pid = self.resolve(proxy)
        sc = self.scripts.unban(keys=[self.avail_key], args=[self.prefix, pid, _SCORE_ARG])
        if not sc:
            raise InvalidInput(f"unknown proxy {pid!r}")
        return float(sc)

    def resolve(self, proxy: str) -> str:
        """A proxy id from an id (``host:port[~session]``) or a proxy URL."""
        if not isinstance(proxy, str) or not proxy:
            raise InvalidInput("proxy must be an id or URL")
        if "://" not in proxy and ("~" in proxy or self.client.sismember(self.prefix + "all", proxy)):
            return proxy
        return parse_proxy_url(proxy).id

    # ------------------------------------------------------------------ per-domain knobs
    def set_domain_rate(self, domain: str, rate: str | tuple[int, float] | None) -> None:
        """Override the per proxy × domain rate for every worker (None restores the default)."""
        self._domain_config(domain, "rate", rate)

    def set_domain_budget(self, domain: str, rate: str | tuple[int, float] | None) -> None:
        """Cap a domain's requests across ALL proxies (e.g. ``"100/60"``); None removes the cap."""
        self._domain_config(domain, "budget", rate)

    def _domain_config(self, domain: str, which: str, rate: object) -> None:
        dom = normalize_domain(domain)
        n, w = (0, 0.0) if rate is None else parse_rate(rate, which)
        self.scripts.domain_config(keys=[self.avail_key], args=[self.prefix, dom, which, n, int(w * 1000)])

    def set_group_cap(self, group: str, cap: int) -> None:
        """Concurrency cap shared by every worker for a group of proxies (a tunnel)."""
        if not group or cap < 1:
            raise InvalidInput("group must be non-empty and cap >= 1")
        self.scripts.add(
            keys=[self.avail_key], args=[self.prefix, "[]", json.dumps({group: int(cap)}), _SCORE_ARG]
        )

    # ------------------------------------------------------------------ borrow and return
    def acquire(
        self, domain: str, *, worker: str = "", exclude: Iterable[str] = (), ttl: float | None = None
    ) -> ProxyLease:
        """Borrow the best usable proxy for ``domain`` (one round trip) or raise NoProxyAvailable.

        ``exclude`` lists proxy ids this caller must not get (the fetcher passes the ones a retry already
        used). ``ttl`` overrides the lock lease (seconds).
        """
        if not isinstance(domain, str):
            raise InvalidInput("domain must be a string")
        dom = _domain_cache(domain)
        cfg = self.config
        rn, rw = cfg.domain_rates.get(dom, cfg.rate)
        bn, bw = cfg.domain_budgets.get(dom, (0, 0.0))
        lock_ms = int((ttl or cfg.lock_ttl) * 1000)
        if lock_ms < 1:
            raise InvalidInput("lease ttl must be > 0")
        token = _token()
        res = self.scripts.acquire(
            keys=[self.avail_key],
            args=[
                self.prefix,
                dom,
                str(worker)[:100],
                token,
                lock_ms,
                rn,
                int(rw * 1000),
                int(cfg.window_margin * 1000),
                " ".join(exclude),
                bn,
                int(bw * 1000),
            ],
        )
        if res[0] != "ok":
            retry = int(res[1]) / 1000.0
            exc = NoProxyAvailable(f"no proxy available for {dom} ({res[2]}); retry in {retry:.2f}s", retry)
            exc.reason = str(res[2])  # type: ignore[attr-defined]
            raise exc
        return ProxyLease(res[1], dom, res[2], res[3], str(worker), int(res[5]), int(res[4]))

    def release(
        self,
        lease: ProxyLease,
        ok: bool | None = None,
        *,
        latency_ms: float | None = None,
        status: int | None = None,
        outcome: str | None = None,
        retry_after: float | None = None,
    ) -> str:
        """Return a lease with what happened (one round trip). Returns 'ok', 'late' or 'stale'.

        Either give ``outcome`` (ok, permanent, blocked, server, transport, unused) or let it be derived
        from ``ok`` and ``status``. ``retry_after`` (seconds, from a 429's header) lengthens the domain ban.
        """
        if outcome is None:
            outcome = outcome_for(ok, status)
        if outcome not in OUTCOMES:
            raise InvalidInput(f"outcome must be one of {', '.join(OUTCOMES)}")
        res = self.scripts.release(
            keys=[self.avail_key],
            args=[
                self.prefix,
                lease.proxy_id,
                lease.domain,
                lease.token,
                outcome,
                -1 if latency_ms is None else max(0, int(latency_ms)),
                int(status or 0),
                int(max(0.0, retry_after or 0.0) * 1000),
                random.random(),
                self.config._release_cfg,
                _SCORE_ARG,
            ],
        )
        return str(res[0])

    def reap(self, limit: int = 1000) -> int:
        """Empty the in-use zone of leases whose borrower died; returns how many."""
        return int(self.scripts.reap(keys=[self.avail_key], args=[self.prefix, int(limit)]))

    # ------------------------------------------------------------------ health-check plumbing
    def claim_for_check(
        self, limit: int = 50, claim_seconds: float = 60.0
    ) -> list[tuple[str, str, str, str]]:
        """Claim due proxies for a health check: [(id, url, zone, source)] (url with credentials)."""
        flat = self.scripts.health_claim(
            keys=[self.avail_key], args=[self.prefix, int(limit), int(claim_seconds * 1000)]
        )
        return [tuple(flat[i : i + 4]) for i in range(0, len(flat), 4)]  # type: ignore[misc]

    def record_check(self, proxy_id: str, ok: bool, latency_ms: float = 0.0) -> str:
        """Fold one health-check result: restore ('avail') or demote ('tban'/'pban')."""
        cfg = self.config
        ban_cfg = f"{int(cfg.ban_base * 1000)} {int(cfg.ban_cap * 1000)} {cfg.max_temp_bans}"
        return str(
            self.scripts.health_result(
                keys=[self.avail_key],
                args=[
                    self.prefix,
                    proxy_id,
                    1 if ok else 0,
                    max(0, int(latency_ms)),
                    random.random(),
                    ban_cfg,
                    _SCORE_ARG,
                ],
            )
        )

    # ------------------------------------------------------------------ reading (not on the hot path)
    def get(self, proxy: str) -> ProxyInfo | None:
        pid = self.resolve(proxy)
        m = self.client.hgetall(self.prefix + "m:" + pid)
        return _info(pid, m) if m else None

    def list(self, state: str | None = None) -> list[ProxyInfo]:
        """Every proxy (or those in one state: avail, new, tban, pban), best score first; masked."""
        if state is not None and state not in ZONES:
            raise InvalidInput(f"state must be one of {', '.join(ZONES)}")
        if state is None:
            ids = sorted(self.client.smembers(self.prefix + "all"))
        else:
            ids = self.client.zrange(self.prefix + ZONES[state], 0, -1)
        pipe = self.client.pipeline(transaction=False)
        for pid in ids:
            pipe.hgetall(self.prefix + "m:" + pid)
        infos = [_info(pid, m) for pid, m in zip(ids, pipe.execute(), strict=True) if m]
        return sorted(infos, key=lambda i: (i.state != "avail", -i.score, i.id))

    def stats(self) -> dict[str, int]:
        """Zone sizes and counters (acquired, released, no_proxy, out_<outcome>, reaped, bans...)."""
        pipe = self.client.pipeline(transaction=False)
        for zone in ("av", "new", "tb", "pb", "iu"):
            pipe.zcard(self.prefix + zone)
        pipe.hgetall(self.prefix + "stats")
        av, new, tb, pb, iu, counters = pipe.execute()
        out = {"available": av, "new": new, "temp_banned": tb, "perm_banned": pb, "in_use": iu}
        out.update({k: int(v) for k, v in counters.items()})
        out["released"] = sum(v for k, v in out.items() if k.startswith("out_"))
        out["acquired"] = out["released"] + iu + out.get("reaped", 0)
        return out

    def has_proxies(self) -> bool:
        """Whether any proxy was ever configured (in any zone, banned ones too): then work goes
        through the pool, and "none usable now" means waiting, not fetching directly."""
        stats = self.stats()
        return any(stats[zone] for zone in ("available", "new", "temp_banned", "perm_banned", "in_use"))


@functools.lru_cache(maxsize=4096)
def _domain_cache(domain: str) -> str:
    """normalize_domain, memoized: acquire is the hot path and domains repeat."""
    return normalize_domain(domain)


def _info(pid: str, m: dict[str, str]) -> ProxyInfo:
    def num(name: str, default: float = 0) -> float:
        try:
            return float(m.get(name, default))
        except ValueError:
            return default

    t = num("t")
    return ProxyInfo(
        id=pid,
        url=m.get("masked") or mask_url(m.get("url", "")),
        state=m.get("state", "?"),
        source=m.get("source", ""),
        score=round(num("score"), 4),
        success=round(num("s") / t, 4) if t else 0.0,
        latency_ms=int(num("lat_ewma", -1)),
        ok=int(num("n_ok")),
        transport_errors=int(num("n_tr")),
        blocked=int(num("n_blk")),
        server_errors=int(num("n_5xx")),
        borrowed=int(num("n_acq")),
        ban_until_ms=int(num("ban_until")),
        expires_at_ms=int(num("expires_at")),
        last_used_by=m.get("last_used_by", ""),
        last_used_at_ms=int(num("last_used_at")),
        ban_reason=m.get("ban_reason", ""),
    )
