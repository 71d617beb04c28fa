"""Scrapy settings → celery-ha settings, the Scrapy-only knobs, and the pool both middlewares use.

Two kinds of names live in a Scrapy ``settings.py``:

* celery-ha's own variables (``CELERY_HA_REDIS_URL``, ``CELERY_HA_NAMESPACE``, ``CELERY_HA_PROXY_RATE``,
  ``CELERY_HA_PROXY_DOMAIN_RATES``, ``CELERY_HA_DIRECT_WHEN_EMPTY``, the Sentinel ones …). They go through
  :meth:`celery_ha.base.settings.Settings.from_overrides`, so the environment wins over the settings
  file exactly as it does for workers and Django, and a misspelt name is refused, not ignored.
* ``CELERY_HA_SCRAPY_*``: knobs only the Scrapy integration has (rotations, backoff, waiting). They are
  Scrapy settings only (``settings.py``, ``custom_settings``, ``scrapy crawl -s``), not environment
  variables: only ``celery_ha.base.settings`` reads the environment.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from scrapy.settings import BaseSettings

from celery_ha.base.errors import ConfigurationError, InvalidInput
from celery_ha.base.settings import Settings
from celery_ha.fetch.classify import CAPTCHA_MARKERS
from celery_ha.proxy import PoolConfig, ProxyPool
from celery_ha.redisio.client import redis_client
from celery_ha.runtime.resolve import resolve_redis_url

#: Prefix of the knobs only the Scrapy integration reads (Scrapy settings, not environment variables).
SCRAPY_PREFIX = "CELERY_HA_SCRAPY_"
#: PoolConfig fields a Scrapy project may set in ``CELERY_HA_SCRAPY_POOL`` (the rates have their own
#: celery-ha variables, which the environment can override).
POOL_FIELDS = frozenset(f.name for f in fields(PoolConfig)) - {"rate", "domain_rates"}
#: The longest a Redis round trip may block Twisted's reactor before it counts as an outage (s).
REDIS_SOCKET_TIMEOUT = 2.0


@dataclass(frozen=True)
class ScrapyKnobs:
    """The ``CELERY_HA_SCRAPY_*`` settings, validated once."""

    enabled: bool = True  # CELERY_HA_SCRAPY_ENABLED
    max_rotations: int = 10  # CELERY_HA_SCRAPY_MAX_ROTATIONS: proxies one page may switch through
    backoff_base: float = 0.5  # CELERY_HA_SCRAPY_BACKOFF_BASE: first retry delay (s), doubling
    backoff_cap: float = 30.0  # CELERY_HA_SCRAPY_BACKOFF_CAP: longest retry delay, Retry-After included
    max_wait: float = 300.0  # CELERY_HA_SCRAPY_MAX_WAIT: longest wait for a free proxy (s); 0 = forever
    worker: str = ""  # CELERY_HA_SCRAPY_WORKER: borrower name in the pool; "" = scrapy:host:pid:spider
    proxy_slots: bool = True  # CELERY_HA_SCRAPY_PROXY_SLOTS: one download slot per proxy × domain
    pool: Mapping[str, Any] = field(default_factory=dict)  # CELERY_HA_SCRAPY_POOL: PoolConfig fields
    captcha_markers: tuple[str, ...] = CAPTCHA_MARKERS  # CELERY_HA_SCRAPY_CAPTCHA_MARKERS


def _number(kind: Callable[[Any], Any], low: float, high: float) -> Callable[[str, Any], Any]:
    def parse(name: str, value: Any) -> Any:
        try:
            number = kind(value)
        except (TypeError, ValueError):
            raise ConfigurationError(f"{name}={value!r} is not a {kind.__name__}") from None
        if not low <= number <= high:
            raise ConfigurationError(f"{name}={value!r} must be between {low} and {high}")
        return number

    return parse


def _flag(name: str, value: Any) -> bool:
    try:
        return BaseSettings({name: value}).getbool(name)
    except ValueError:
        raise ConfigurationError(f"{name}={value!r} must be a boolean (True/False, 1/0)") from None


def _worker(name: str, value: Any) -> str:
    text = str(value or "")
    if len(text) > 100 or not (text.isascii() and text.isprintable()):
        raise ConfigurationError(f"{name} must be printable ASCII, at most 100 characters")
    return text


def _pool(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"{name} must be a dict of proxy pool options")
    options = dict(value)
    unknown = sorted(set(options) - POOL_FIELDS)
    if unknown:
        raise ConfigurationError(f"{name}: unknown pool option(s) {', '.join(map(repr, unknown))}; "
                                 f"known: {', '.join(sorted(POOL_FIELDS))}")
    return options


def _markers(name: str, value: Any) -> tuple[str, ...]:
    items = BaseSettings({name: value}).getlist(name)
    if not all(isinstance(m, str) and m.strip() for m in items):
        raise ConfigurationError(f"{name} must be a list of non-empty strings")
    return tuple(m.lower() for m in items)


_KNOBS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "CELERY_HA_SCRAPY_ENABLED": ("enabled", _flag),
    "CELERY_HA_SCRAPY_MAX_ROTATIONS": ("max_rotations", _number(int, 0, 1000)),
    "CELERY_HA_SCRAPY_BACKOFF_BASE": ("backoff_base", _number(float, 0, 3600)),
    "CELERY_HA_SCRAPY_BACKOFF_CAP": ("backoff_cap", _number(float, 0, 86400)),
    "CELERY_HA_SCRAPY_MAX_WAIT": ("max_wait", _number(float, 0, 7 * 86400)),
    "CELERY_HA_SCRAPY_WORKER": ("worker", _worker),
    "CELERY_HA_SCRAPY_PROXY_SLOTS": ("proxy_slots", _flag),
    "CELERY_HA_SCRAPY_POOL": ("pool", _pool),
    "CELERY_HA_SCRAPY_CAPTCHA_MARKERS": ("captcha_markers", _markers),
}


def scrapy_knobs(settings: BaseSettings) -> ScrapyKnobs:
    """The ``CELERY_HA_SCRAPY_*`` knobs of a Scrapy settings object; a misspelt one is refused."""
    values: dict[str, Any] = {}
    for key in settings:
        if not (isinstance(key, str) and key.startswith(SCRAPY_PREFIX)):
            continue
        spec = _KNOBS.get(key)
        if spec is None:
            raise ConfigurationError(f"unknown Scrapy setting {key!r}; known: {', '.join(sorted(_KNOBS))}")
        value = settings.get(key)
        if value is not None:
            values[spec[0]] = spec[1](key, value)
    return ScrapyKnobs(**values)


def _plain(key: str, value: Any) -> Any:
    """A Scrapy value as ``Settings.from_overrides`` takes it: a dict of domain rates becomes
    ``"a.example=2/10,b.example=5/60"`` (Scrapy projects write dicts; the variable is one string)."""
    if isinstance(value, Mapping):
        if key != "CELERY_HA_PROXY_DOMAIN_RATES":
            raise ConfigurationError(f"{key} takes a string, not a dict")
        return ",".join(f"{domain}={rate}" for domain, rate in dict(value).items())
    return value


def celery_ha_settings(settings: BaseSettings, env: Mapping[str, str] | None = None) -> Settings:
    """celery-ha's :class:`Settings` from a Scrapy settings object, the environment winning."""
    values = {
        key: _plain(key, settings.get(key))
        for key in settings
        if isinstance(key, str)
        and (key.startswith("CELERY_HA_") or key == "CELERY_BROKER_URL")
        and not key.startswith(SCRAPY_PREFIX)
    }
    return Settings.from_overrides(values, env)


def build_pool(cfg: Settings, knobs: ScrapyKnobs) -> ProxyPool:
    """The namespace's pool on the configured Redis (or the embedded one, started on demand).

    The client's socket timeout bounds how long one round trip can hold Twisted's reactor when Redis
    stops answering; the middleware then treats the request like "no proxy free yet".
    """
    try:
        pool_config = PoolConfig(rate=cfg.proxy_rate, domain_rates=dict(cfg.proxy_domain_rates),
                                 **dict(knobs.pool))
    except (InvalidInput, TypeError, ValueError) as exc:
        raise ConfigurationError(f"CELERY_HA_SCRAPY_POOL: {exc}") from None
    client = redis_client(
        resolve_redis_url(cfg),
        sentinel_master=cfg.sentinel_master or None,
        sentinel_password=cfg.sentinel_password or None,
        socket_timeout=REDIS_SOCKET_TIMEOUT,
        socket_connect_timeout=REDIS_SOCKET_TIMEOUT,
    )
    return ProxyPool(client, cfg.namespace, pool_config)


def worker_label(knobs: ScrapyKnobs, spider_name: str | None) -> str:
    """The borrower name the pool records (``celery-ha proxies list`` shows it as last user)."""
    if knobs.worker:
        return knobs.worker
    label = f"scrapy:{socket.gethostname()}:{os.getpid()}:{spider_name or 'spider'}"
    return "".join(c if c.isascii() and c.isprintable() else "?" for c in label)[:100]
