"""Where proxies come from: a static list, a tunnel endpoint, an extraction API, a free list.

Every provider only *adds* proxies to the shared pool (``ProxyPool.add_specs``); the pool's scripts decide
how they are used. Providers validate everything first, so a bad entry never half-writes a batch.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests

from celery_ha.base.errors import InvalidInput
from celery_ha.base.masking import mask_url
from celery_ha.base.validation import check_int
from celery_ha.proxy.pool import ProxyPool
from celery_ha.proxy.validation import MAX_PROXY_SECONDS, ProxySpec, parse_proxy_url
from celery_ha.redisio.lock import try_lock, unlock

log = logging.getLogger(__name__)


def _safe_url(url: str) -> str:
    """An API URL for logs: credentials masked, query string (often an API key) dropped."""
    parts = urlsplit(mask_url(url))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


# ---------------------------------------------------------------------------------------------- static
@dataclass
class StaticProvider:
    """A fixed list of proxy URLs (``scheme://[user:pass@]host:port`` or bare ``host:port``)."""

    urls: list[str] = field(repr=False)
    source: str = "static"

    def __repr__(self) -> str:
        return f"StaticProvider({len(self.urls)} proxies, source={self.source!r})"

    def install(self, pool: ProxyPool) -> dict[str, int]:
        """Add every URL in one script (all validated first); returns the pool's add counts."""
        return pool.add_many(self.urls, source=self.source)

    @classmethod
    def from_file(cls, path: str | Path, source: str = "static") -> StaticProvider:
        """One proxy per line; blank lines and ``#`` comments are skipped."""
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        return cls([ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")], source)

    def refresh(self) -> int:
        """Nothing to refresh; present so every provider can be passed to a Fetcher."""
        return 0


# ---------------------------------------------------------------------------------------------- tunnel
@dataclass
class TunnelProvider:
    """One provider endpoint whose exit IP rotates at the provider.

    When the username contains ``{session}`` (e.g. ``http://user-session-{session}:pw@tunnel:8000``), each
    of ``sessions`` sticky sessions becomes its own pool entry, so locks and rate windows are kept per
    session (= per exit IP). Without the placeholder there is one entry for the endpoint. ``concurrency``
    is the provider's cap on simultaneous requests, shared by every worker through a distributed
    semaphore with leases (a crashed worker's slot frees at its lease expiry).
    """

    url: str
    name: str = "tunnel"
    sessions: int = 10
    concurrency: int = 10
    session_ttl: float | None = None  # seconds a sticky session lives at the provider (lifetime score)
    session_tags: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"TunnelProvider(name={self.name!r}, url={mask_url(self.url)!r}, sessions={self.sessions})"

    def specs(self) -> list[ProxySpec]:
        """One validated spec per sticky session (or the one endpoint without a placeholder)."""
        if "{session}" not in self.url:
            return [parse_proxy_url(self.url)]
        check_int("sessions", self.sessions, 1, 10000)
        # "<name>s<i>": i is all digits, so the last 's' splits any tag back into (name, i), and two
        # providers on one endpoint never share a session ("t1" + "0" and "t" + "10" once did). A
        # letter, not '-' or '_': providers often take only letters and digits in a session id.
        tags = self.session_tags or [f"{self.name}s{i}" for i in range(self.sessions)]
        if len(set(tags)) != len(tags):
            raise InvalidInput("session tags must be unique (one pool entry per sticky session)")
        head = self.url.split("@", 1)[0]
        if "{session}" not in head:
            raise InvalidInput("the {session} placeholder must be in the username of the tunnel URL")
        return [parse_proxy_url(self.url.replace("{session}", tag), session=tag) for tag in tags]

    def install(self, pool: ProxyPool) -> dict[str, int]:
        """Add the sessions as one group whose cap every worker shares; returns the add counts."""
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", self.name):
            raise InvalidInput("tunnel name must be 1-32 letters/digits/_/-")
        check_int("tunnel concurrency", self.concurrency, 1, 10**6)
        return pool.add_specs(
            self.specs(), source="tunnel", ttl=self.session_ttl, group=self.name, group_cap=self.concurrency
        )

    def refresh(self) -> int:
        """Nothing to refresh: the provider rotates the exit IPs behind the endpoint itself."""
        return 0


# ---------------------------------------------------------------------------------------------- API
@dataclass
class ApiProvider:
    """An extraction API returning ``ip:port`` lists, fetched by one worker at a time, cached ``cache_ttl``.

    Response shapes: a JSON list of ``"ip:port"`` strings or of objects, or an object holding that list at
    ``path`` (dots: ``"data.proxy_list"``); objects give ``ip_key``/``port_key`` (or one ``"ip:port"`` in
    ``ip_key``) and optionally ``expire_key`` (seconds left, or a UNIX time); plain text with one
    ``ip:port`` per line also works. A failed or garbage response is logged as one line and changes nothing.
    """

    pool: ProxyPool
    url: str
    name: str = "api"
    path: str = ""
    ip_key: str = "ip"
    port_key: str = "port"
    expire_key: str = ""
    scheme: str = "http"
    username: str = ""
    password: str = field(default="", repr=False)
    cache_ttl: float = 30.0
    proxy_ttl: float | None = None  # lifetime given to proxies the API returns without an expiry
    timeout: float = 10.0
    session: requests.Session | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"ApiProvider(name={self.name!r}, url={_safe_url(self.url)!r})"

    def refresh(self, force: bool = False) -> int:
        """Fetch the API unless a fresh result is cached; returns the number of proxies added or updated.

        A short lock makes exactly one worker call the API at a time; the others return 0 at once (the
        pool still holds the previous batch).
        """
        fresh, lock = self.pool.keys.api_fresh(self.name), self.pool.keys.api_lock(self.name)
        client = self.pool.client
        if not force and client.exists(fresh):
            return 0
        token = try_lock(client, lock, self.timeout + 5)
        if token is None:
            return 0
        try:
            if not force and client.exists(fresh):
                return 0
            specs, ttls = self._fetch()
            # Cache failures too (shorter), so a broken API is not hammered by every worker.
            client.set(
                fresh, "1", px=int(self.cache_ttl * 1000 if specs else max(1.0, self.cache_ttl / 6) * 1000)
            )
            if not specs:
                return 0
            result = self.pool.add_specs(specs, source=self.name, ttl=self.proxy_ttl, ttls=ttls)
            return result["added"] + result["updated"]
        finally:
            unlock(client, lock, token)  # compare-and-delete: a slow caller never frees another's lock

    def _fetch(self) -> tuple[list[ProxySpec], dict[str, float]]:
        where = _safe_url(self.url)
        getter = self.session or requests
        try:
            response = getter.get(self.url, timeout=self.timeout)
        except requests.RequestException as exc:
            log.warning("proxy API %s: request failed (%s); pool unchanged", where, type(exc).__name__)
            return [], {}
        if response.status_code != 200:
            log.warning("proxy API %s: HTTP %s; pool unchanged", where, response.status_code)
            return [], {}
        try:
            specs, ttls = self.parse(response.text)
        except InvalidInput as exc:
            log.warning("proxy API %s: unusable response (%s); pool unchanged", where, mask_url(str(exc)))
            return [], {}
        if not specs:
            log.warning("proxy API %s: response held no proxies; pool unchanged", where)
        return specs, ttls

    def parse(self, text: str) -> tuple[list[ProxySpec], dict[str, float]]:
        """Turn a response body into validated specs (all or nothing) and per-id lifetimes."""
        text = text.strip()
        if not text:
            return [], {}
        try:
            data: Any = json.loads(text)
        except RecursionError:  # a JSON bomb: one "unusable response" line, like any garbage
            raise InvalidInput("JSON nested too deeply") from None
        except ValueError:
            if not re.fullmatch(r"[\w.:\-\s]+", text):
                raise InvalidInput("neither JSON nor ip:port lines") from None
            data = text.split()
        for part in filter(None, self.path.split(".")):
            if not isinstance(data, dict) or part not in data:
                raise InvalidInput(f"no {self.path!r} in the JSON")
            data = data[part]
        if not isinstance(data, list):
            raise InvalidInput("expected a list of proxies")
        specs: list[ProxySpec] = []
        ttls: dict[str, float] = {}
        for entry in data:
            expire: Any = None
            if isinstance(entry, str):
                address = entry
            elif isinstance(entry, dict):
                ip = entry.get(self.ip_key)
                port = entry.get(self.port_key)
                if not isinstance(ip, str):
                    raise InvalidInput(f"entry without a string {self.ip_key!r}")
                address = f"{ip}:{port}" if port is not None else ip
                expire = entry.get(self.expire_key) if self.expire_key else None
            else:
                raise InvalidInput("list entries must be strings or objects")
            auth = f"{self.username}:{self.password}@" if self.username else ""
            spec = parse_proxy_url(f"{self.scheme}://{auth}{address.strip()}")
            specs.append(spec)
            if isinstance(expire, (int, float)) and not isinstance(expire, bool) and expire > 0:
                ttls_left = _seconds_left(float(expire))
                if ttls_left > 0:
                    ttls[spec.id] = ttls_left
        return specs, ttls


def _seconds_left(expire: float) -> float:
    """An API's expiry as seconds from now: seconds left, a UNIX time in seconds, or one in ms (some
    APIs send ``Date.now()``-style stamps). Beyond the pool's longest lifetime it is garbage."""
    if expire > 1e12:
        expire /= 1000.0
    left = expire - time.time() if expire > 1e9 else expire
    if left > MAX_PROXY_SECONDS:
        raise InvalidInput(f"expiry {expire:.0f} is more than {MAX_PROXY_SECONDS} s away")
    return left


# ---------------------------------------------------------------------------------------------- free lists
_ALIVE_UNITS = {
    "d": 86400,
    "天": 86400,
    "h": 3600,
    "小时": 3600,
    "时": 3600,
    "m": 60,
    "min": 60,
    "分钟": 60,
    "分": 60,
    "s": 1,
    "sec": 1,
    "秒": 1,
}
_ALIVE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(d|天|h|小时|时|min|m|分钟|分|sec|s|秒)?", re.I)


def parse_alive(text: str) -> float:
    """Survival time in seconds from ``"3h"``, ``"2小时15分"``, ``"125min"``, ``"7200"`` (seconds)."""
    total = 0.0
    found = False
    for number, unit in _ALIVE_RE.findall(str(text)):
        found = True
        total += float(number) * _ALIVE_UNITS.get((unit or "s").lower(), 1)
    if not found:
        raise InvalidInput(f"bad survival time {text!r}")
    return total


@dataclass
class FreeListProvider:
    """A free proxy list (file path or http URL): lines ``ip:port <survival>`` or a JSON list of
    ``{"ip", "port", "alive"}``. Only entries that survived longer than ``min_alive`` (default 2 h) are
    admitted, and only on probation: they wait in the 'new' zone until a health check passes, and a
    failed check bans them for good. Free proxies are a supplement, never the main supply.
    """

    source: str
    min_alive: float = 7200.0
    timeout: float = 10.0

    def __repr__(self) -> str:
        shown = _safe_url(self.source) if "://" in self.source else self.source
        return f"FreeListProvider({shown!r}, min_alive={self.min_alive})"

    def entries(self) -> list[tuple[str, float]]:
        """Every listed (address, survival seconds), unvalidated; unreadable survival times raise."""
        if self.source.startswith(("http://", "https://")):
            response = requests.get(self.source, timeout=self.timeout)
            response.raise_for_status()
            text = response.text
        else:
            text = Path(self.source).read_text(encoding="utf-8")
        out: list[tuple[str, float]] = []
        stripped = text.strip()
        if stripped.startswith("["):
            try:
                items = json.loads(stripped)
            except (ValueError, RecursionError):
                raise InvalidInput("free list: not valid JSON") from None
            for item in items:
                if not isinstance(item, dict) or "ip" not in item or "port" not in item:
                    raise InvalidInput("free list: each JSON entry needs an 'ip' and a 'port'")
                out.append((f"{item['ip']}:{item['port']}", parse_alive(str(item.get("alive", "0")))))
            return out
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = re.split(r"[\s,;|]+", line, maxsplit=1)
            out.append((parts[0], parse_alive(parts[1]) if len(parts) > 1 else 0.0))
        return out

    def install(self, pool: ProxyPool) -> dict[str, int]:
        """Admit the long-lived entries (validated all at once); returns counts incl. ``too_young``."""
        entries = self.entries()
        keep = [parse_proxy_url(a) for a, alive in entries if alive > self.min_alive]
        result = pool.add_specs(keep, source="free", verify=True)
        result["too_young"] = len(entries) - len(keep)
        return result

    def refresh(self) -> int:
        """Nothing to refresh: install reads the list once; health checks decide which entries stay."""
        return 0


def install_all(pool: ProxyPool, providers: Iterable[Any]) -> dict[str, dict[str, int]]:
    """Install several providers; returns their counts by class name."""
    return {type(p).__name__: p.install(pool) for p in providers}
