"""The centralized proxy pool: every worker borrows from and returns to the same Redis state.

Why central: per-worker proxy lists let five machines hit one site through one IP at once, and a proxy
one worker found dead stays in use everywhere else. Here the lock per proxy × domain, the rate window,
the bans and the scores live in Redis and change only inside Lua scripts (one round trip each for
acquire and release), timed by the Redis clock so workers' clocks never matter.

Zones (``keys.py``): available (``av``, ranked by score), in use (``iu``, leases with an expiry,
emptied by the reaper when a borrower dies), new (``new``, waiting for a first health check),
temporarily banned (``tb``, score = unban time) and permanently banned (``pb``).
"""

from __future__ import annotations

import functools
import json
import logging
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import redis

from celery_ha.base.errors import InvalidInput, NoProxyAvailable
from celery_ha.base.validation import (
    MAX_URL_BYTES,
    check_int,
    check_namespace,
    check_number,
    check_seconds,
    check_text,
    clean_message,
    parse_rate,
)
from celery_ha.proxy.config import PoolConfig
from celery_ha.proxy.keys import STATES, ProxyKeys
from celery_ha.proxy.outcomes import OUTCOMES, outcome_for
from celery_ha.proxy.records import add_item, proxy_info
from celery_ha.proxy.scoring import SCORE_ARG
from celery_ha.proxy.tokens import new_token
from celery_ha.proxy.types import ProxyInfo, ProxyLease
from celery_ha.proxy.validation import (
    MAX_PROXY_SECONDS,
    ProxySpec,
    check_exclude,
    check_lifetimes,
    check_specs,
    normalize_domain,
    parse_proxy_url,
)
from celery_ha.redisio.client import client_address, redis_client
from celery_ha.redisio.scripts import ScriptSet

log = logging.getLogger(__name__)

#: Longest request latency release() takes (ms): a day; anything longer is a caller's bug.
MAX_LATENCY_MS = 86_400_000


class ProxyPool:
    """Client of the pool stored under ``cha:{namespace}:px:`` in Redis. Thread-safe (redis-py pool).

    Every script call routes on the available zone's key (``KEYS[1]``) and gets the prefix as
    ``ARGV[1]``; all other keys share the namespace's hash tag, so the scripts stay cluster-legal.
    """

    SCRIPT_DIR = Path(__file__).parent

    def __init__(
        self, client: redis.Redis, namespace: str = "default", config: PoolConfig | None = None
    ) -> None:
        self.client = client
        self.namespace = check_namespace(namespace)
        self.config = config or PoolConfig.from_env()
        self.keys = ProxyKeys(namespace)
        self.prefix = self.keys.prefix
        self.scripts = ScriptSet(client, self.SCRIPT_DIR, library_prelude="_common")  # Redis 7: FCALL

    @property
    def avail_key(self) -> str:
        """The available zone: the key every script call routes on."""
        return self.keys.available

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
        return f"ProxyPool(namespace={self.namespace!r}, redis={client_address(self.client)!r})"

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
        until a health check passes (free lists), or, when none runs (``PoolConfig.unban_by_time``), until
        the next acquire, with a warning; ``group`` ties it to a shared concurrency cap.
        """
        spec = parse_proxy_url(url, session=session)
        self.add_specs([spec], source=source, ttl=ttl, verify=verify, group=group)
        return spec.id

    def add_many(
        self, urls: Iterable[str], *, source: str = "static", ttl: float | None = None, verify: bool = False
    ) -> dict[str, int]:
        """Add many proxies atomically: all are validated first, so one bad URL writes nothing."""
        if isinstance(urls, (str, bytes)):
            raise InvalidInput("urls must be a list of proxy URLs, not one string")
        try:
            specs = [parse_proxy_url(u) for u in urls]
        except TypeError:
            raise InvalidInput(f"urls must be a list of proxy URLs, got {type(urls).__name__}") from None
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
        check_text("source", source, 32)
        if ttl is not None:
            check_seconds("ttl", ttl, high=MAX_PROXY_SECONDS)
        if group is not None:
            check_text("group", group, 64)
        if group_cap is not None and (group is None or check_int("group_cap", group_cap, 1, 10**6) < 1):
            raise InvalidInput("group_cap needs a group and must be >= 1")
        lifetimes = check_lifetimes(ttls)
        specs = check_specs(specs)
        items = [
            add_item(spec, source=source, lifetime=lifetimes.get(spec.id, ttl), verify=verify, group=group)
            for spec in specs
        ]
        if not items:
            return {"added": 0, "updated": 0, "skipped": 0}
        caps = {group: int(group_cap)} if group and group_cap else {}
        added, updated, skipped, conflicts = self.scripts.add(
            keys=[self.keys.available], args=[self.prefix, json.dumps(items), json.dumps(caps), SCORE_ARG]
        )
        if int(conflicts):  # an id is never moved between groups (two providers' caps would mix)
            log.warning("proxy add: %d id(s) already belong to another group; left there", int(conflicts))
        self.config.warn_unchecked(int(added) if verify else 0)  # once, when no check would ever run
        return {"added": int(added), "updated": int(updated), "skipped": int(skipped)}

    def remove(self, proxy: str) -> bool:
        """Forget a proxy (by id or URL)."""
        return bool(
            self.scripts.remove(keys=[self.keys.available], args=[self.prefix, self.resolve(proxy)])
        )

    def ban(self, proxy: str, seconds: float | None = None, reason: str = "manual") -> str:
        """Ban by hand: for ``seconds``, or permanently when None. Returns the new state."""
        if seconds is not None:
            check_seconds("ban seconds (omit for a permanent ban)", seconds, high=MAX_PROXY_SECONDS)
        if not isinstance(reason, str):
            raise InvalidInput(f"ban reason must be a string, got {type(reason).__name__}")
        pid = self.resolve(proxy)
        state = self.scripts.ban(
            keys=[self.keys.available, self.keys.stats],
            args=[self.prefix, pid, int(seconds * 1000) if seconds else 0, clean_message(reason, 200)],
        )
        if not state:
            raise InvalidInput(f"unknown proxy {pid!r}")
        return str(state)

    def unban(self, proxy: str) -> float | None:
        """Lift every ban and failure count of a proxy; returns its score in the available zone, or None
        when only the ban of a proxy that left the pool (expired) was lifted: its provider may add it."""
        pid = self.resolve(proxy)
        sc = self.scripts.unban(keys=[self.keys.available], args=[self.prefix, pid, SCORE_ARG])
        if sc is None:
            raise InvalidInput(f"unknown proxy {pid!r}")
        return None if sc in ("", b"") else float(sc)

    def resolve(self, proxy: str) -> str:
        """A proxy id from an id (``host:port[~session]``) or a proxy URL."""
        if not isinstance(proxy, str) or not proxy:
            raise InvalidInput("proxy must be an id or URL")
        try:
            check_text("proxy", proxy, MAX_URL_BYTES)
        except InvalidInput as exc:  # the message names the character, never the text (credentials)
            raise InvalidInput(str(exc)) from None
        if "://" not in proxy and ("~" in proxy or self.client.sismember(self.keys.all, proxy)):
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
        self.scripts.domain_config(
            keys=[self.keys.available], args=[self.prefix, dom, which, n, int(w * 1000)]
        )

    def set_group_cap(self, group: str, cap: int) -> None:
        """Concurrency cap shared by every worker for a group of proxies (a tunnel)."""
        check_text("group", group, 64)
        check_int("cap", cap, 1, 10**6)
        self.scripts.add(
            keys=[self.keys.available], args=[self.prefix, "[]", json.dumps({group: int(cap)}), SCORE_ARG]
        )

    # ------------------------------------------------------------------ borrow and return
    def acquire(
        self, domain: str, *, worker: str = "", exclude: Iterable[str] = (), ttl: float | None = None
    ) -> ProxyLease:
        """Borrow the best usable proxy for ``domain`` (one round trip) or raise NoProxyAvailable.

        ``exclude`` lists proxy ids this caller must not get (the fetcher passes the ones a retry already
        used). ``ttl`` overrides the lock lease (seconds). The error's ``reason`` says why none was free
        (``empty``, ``excluded``, ``busy``, ``budget``), so the fetcher can refresh providers or give up.
        """
        if not isinstance(domain, str):
            raise InvalidInput("domain must be a string")
        dom = _domain_cache(domain)
        cfg = self.config
        rn, rw = cfg.domain_rates.get(dom, cfg.rate)
        bn, bw = cfg.domain_budgets.get(dom, (0, 0.0))
        lock_ms = int((cfg.lock_ttl if ttl is None else check_seconds("lease ttl", ttl)) * 1000)
        if lock_ms < 1:
            raise InvalidInput("lease ttl must be > 0")
        if not isinstance(worker, str):
            raise InvalidInput(f"worker must be a string, got {type(worker).__name__}")
        label = worker[:100]
        if not (label.isascii() and label.isprintable()):
            check_text("worker", label, 100, empty=True)
        excluded = check_exclude(exclude)
        token = new_token()
        res = self.scripts.acquire(
            keys=[self.keys.available, self.keys.domains],
            args=[
                self.prefix,
                dom,
                label,
                token,
                lock_ms,
                rn,
                int(rw * 1000),
                int(cfg.window_margin * 1000),
                excluded,
                bn,
                int(bw * 1000),
                1 if cfg.unban_by_time else 0,
                SCORE_ARG,
            ],
        )
        if res[0] != "ok":
            retry = int(res[1]) / 1000.0
            exc = NoProxyAvailable(f"no proxy available for {dom} ({res[2]}); retry in {retry:.2f}s", retry)
            exc.reason = str(res[2])  # type: ignore[attr-defined]
            raise exc
        return ProxyLease(res[1], dom, res[2], res[3], worker, int(res[5]), int(res[4]))

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

        Either give ``outcome`` (ok, permanent, blocked, server, transport, aborted, unused) or let it be
        derived from ``ok`` and ``status``. ``retry_after`` (seconds, from a 429's header) lengthens the
        domain ban.
        """
        if not isinstance(lease, ProxyLease):
            raise InvalidInput(f"lease must be a ProxyLease from acquire(), got {type(lease).__name__}")
        for part in (lease.proxy_id, lease.domain, lease.token):  # all ASCII when acquire() made them
            if type(part) is not str or not part or not (part.isascii() and part.isprintable()):
                raise InvalidInput("lease was not made by acquire() (a field was changed)")
        if status is not None:
            check_int("status", status, 0, 999)
        if latency_ms is not None:
            check_number("latency_ms", latency_ms, -MAX_LATENCY_MS, MAX_LATENCY_MS)
        if retry_after is not None:
            check_number("retry_after", retry_after, -MAX_PROXY_SECONDS, MAX_PROXY_SECONDS)
        if outcome is None:
            outcome = outcome_for(ok, status)
        if not isinstance(outcome, str) or outcome not in OUTCOMES:
            raise InvalidInput(f"outcome must be one of {', '.join(OUTCOMES)}")
        res = self.scripts.release(
            keys=[self.keys.available],
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
                self.config.release_arg,
                SCORE_ARG,
            ],
        )
        return str(res[0])

    def reap(self, limit: int = 1000) -> int:
        """Empty the in-use zone of leases whose borrower died; returns how many."""
        limit = check_int("limit", limit, 1, 100_000)
        args = [self.prefix, limit, 1 if self.config.unban_by_time else 0, SCORE_ARG]
        return int(self.scripts.reap(keys=[self.keys.available], args=args))

    # ------------------------------------------------------------------ health-check plumbing
    def claim_for_check(
        self, limit: int = 50, claim_seconds: float = 60.0
    ) -> list[tuple[str, str, str, str, str]]:
        """Claim due proxies for a health check: [(id, url, zone, source, claim)] (url with credentials;
        pass ``claim`` to :meth:`record_check`, so a ban made meanwhile is not undone by the probe)."""
        limit = check_int("limit", limit, 1, 100_000)
        claim_ms = int(check_seconds("claim_seconds", claim_seconds, high=86_400) * 1000)
        flat = self.scripts.health_claim(keys=[self.keys.available], args=[self.prefix, limit, claim_ms])
        return [tuple(flat[i : i + 5]) for i in range(0, len(flat), 5)]  # type: ignore[misc]

    def record_check(self, proxy_id: str, ok: bool, latency_ms: float = 0.0, claim: str = "") -> str:
        """Fold one health-check result: restore ('avail') or demote ('tban'/'pban'); 'skip' when the
        claim no longer holds (banned, unbanned or claimed again meanwhile)."""
        proxy_id = check_text("proxy id", proxy_id)
        claim = check_text("claim", claim, 64, empty=True)
        if not isinstance(ok, bool):
            raise InvalidInput(f"ok must be True or False, got {type(ok).__name__}")
        latency_ms = check_number("latency_ms", latency_ms, 0, 3_600_000, unit="ms")
        return str(
            self.scripts.health_result(
                keys=[self.keys.available],
                args=[
                    self.prefix,
                    proxy_id,
                    1 if ok else 0,
                    max(0, int(latency_ms)),
                    random.random(),
                    self.config.health_ban_arg,
                    SCORE_ARG,
                    claim,
                ],
            )
        )

    # ------------------------------------------------------------------ reading (not on the hot path)
    def get(self, proxy: str) -> ProxyInfo | None:
        """One proxy by id or URL, masked; None when it is unknown."""
        pid = self.resolve(proxy)
        fields = self.client.hgetall(self.keys.meta(pid))
        return proxy_info(pid, fields) if fields else None

    def list(self, state: str | None = None) -> list[ProxyInfo]:
        """Every proxy (or those in one state: avail, new, tban, pban), best score first; masked."""
        if state is not None and state not in STATES:
            raise InvalidInput(f"state must be one of {', '.join(STATES)}")
        if state is None:
            ids = sorted(self.client.smembers(self.keys.all))
        else:
            ids = self.client.zrange(self.keys.zone(state), 0, -1)
        pipe = self.client.pipeline(transaction=False)
        for pid in ids:
            pipe.hgetall(self.keys.meta(pid))
        infos = [proxy_info(pid, m) for pid, m in zip(ids, pipe.execute(), strict=True) if m]
        return sorted(infos, key=lambda i: (i.state != "avail", -i.score, i.id))

    def stats(self) -> dict[str, int]:
        """Zone sizes and counters (acquired, released, no_proxy, out_<outcome>, reaped, bans...)."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        for zone in (k.available, k.new, k.temp_banned, k.perm_banned, k.in_use):
            pipe.zcard(zone)
        pipe.hgetall(k.stats)
        av, new, tb, pb, iu, counters = pipe.execute()
        out = {"available": av, "new": new, "temp_banned": tb, "perm_banned": pb, "in_use": iu}
        out.update({name: int(v) for name, v in counters.items()})
        out["released"] = sum(v for name, v in out.items() if name.startswith("out_"))
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
