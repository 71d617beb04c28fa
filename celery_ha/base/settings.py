"""Settings read from the environment (or Django settings), validated once, with documented defaults.

Every knob has an environment variable. A bad value raises :class:`ConfigurationError` naming the
variable, so a worker fails at start-up with one clear line instead of misbehaving later; a
``CELERY_HA_*`` variable that is no knob (a typo) is named in a warning, once per process.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from celery_ha.base import setting_parsers as parse
from celery_ha.base.errors import ConfigurationError
from celery_ha.base.masking import mask_url
from celery_ha.base.namespace_lists import matches_namespace_pattern as _matches
from celery_ha.base.namespace_lists import namespace_names, namespace_patterns, parse_namespaces
from celery_ha.base.setting_parsers import MAX_BATCH_IDS as MAX_BATCH_IDS
from celery_ha.base.setting_parsers import check_redis_url as check_redis_url
from celery_ha.base.urls import UrlRules
from celery_ha.base.validation import check_namespace, check_task_name, parse_rate

log = logging.getLogger(__name__)


def _django_settings() -> Any:
    """Django's settings object when this is a Django process (configured, or named by
    ``DJANGO_SETTINGS_MODULE``, which a Celery worker of a Django project loads anyway), else None."""
    try:
        from django.conf import settings as dj  # type: ignore[import-not-found]

        if dj.configured or os.environ.get("DJANGO_SETTINGS_MODULE"):
            dj.INSTALLED_APPS  # noqa: B018 - configures the lazy settings from DJANGO_SETTINGS_MODULE
            return dj
    except Exception:  # Django absent, or its settings cannot load: environment only.
        return None
    return None


def _django_setting(name: str) -> Any:
    """A knob from Django settings: the ``CELERY_HA`` dict (by short or full name) first, then a
    top-level ``CELERY_HA_*`` setting. So a worker of a Django project reads the same dict as its web
    processes, with no second copy in the environment."""
    dj = _django_settings()
    if dj is None:
        return None
    table = getattr(dj, "CELERY_HA", None)
    if isinstance(table, Mapping):
        short = name.removeprefix("CELERY_HA_").removeprefix("CELERY_")
        for key, value in table.items():
            if str(key).upper() in (name, short) and value is not None:
                return ("1" if value else "0") if isinstance(value, bool) else value
    return getattr(dj, name, None)


def django_has(name: str) -> bool:
    """Whether Django's settings hold ``name`` (celery-ha reads ``CELERY_HA`` and ``CELERY_HA_*`` there)."""
    dj = _django_settings()
    return dj is not None and getattr(dj, name, None) is not None


def raw_setting(name: str, env: Mapping[str, str] | None = None, django: bool | None = None) -> str | None:
    """The raw string of a setting: environment (or ``env``) first, then Django settings (read by
    default only when ``env`` is None)."""
    source = os.environ if env is None else env
    value = source.get(name)
    if value is None or value == "":
        dj = _django_setting(name) if (env is None if django is None else django) else None
        return None if dj is None else str(dj)
    return value


_ENV: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "redis_url": ("CELERY_HA_REDIS_URL", parse.redis_url),
    "embedded": ("CELERY_HA_EMBEDDED", parse.flag),
    "broker_url": ("CELERY_BROKER_URL", parse.text),
    "namespace": ("CELERY_HA_NAMESPACE", parse.checked(check_namespace)),
    "namespaces": ("CELERY_HA_NAMESPACES", parse_namespaces),
    "discovery_interval": ("CELERY_HA_DISCOVERY_INTERVAL", parse.number(float, 0.1, 3600)),
    "lease_ttl": ("CELERY_HA_LEASE_TTL", parse.number(float, 1, 86400)),
    "heartbeat_interval": ("CELERY_HA_HEARTBEAT_INTERVAL", parse.number(float, 0.05, 3600)),
    "reclaim_interval": ("CELERY_HA_RECLAIM_INTERVAL", parse.number(float, 0.1, 3600)),
    "max_attempts": ("CELERY_HA_MAX_ATTEMPTS", parse.number(int, 1, 1000)),
    "max_stalls": ("CELERY_HA_MAX_STALLS", parse.number(int, 0, 1000)),
    "window": ("CELERY_HA_WINDOW", parse.number(int, 0, 1_000_000)),
    "checkpoint_every": ("CELERY_HA_CHECKPOINT_EVERY", parse.number(int, 1, 1_000_000)),
    "task_time_limit": ("CELERY_HA_TASK_TIME_LIMIT", parse.number(float, 1, 7 * 86400)),
    "visibility_timeout": ("CELERY_HA_VISIBILITY_TIMEOUT", parse.number(float, 1, 30 * 86400)),
    "proxy_rate": ("CELERY_HA_PROXY_RATE", parse.checked(parse_rate)),
    "proxy_domain_rates": ("CELERY_HA_PROXY_DOMAIN_RATES", parse.domain_rates),
    "proxy_check_url": ("CELERY_HA_PROXY_CHECK_URL", parse.text),
    "data_dir": ("CELERY_HA_DATA_DIR", parse.text),
    "redispatch_after": ("CELERY_HA_REDISPATCH_AFTER", parse.number(float, 1, 86400)),
    "soft_shutdown_timeout": ("CELERY_HA_SOFT_SHUTDOWN_TIMEOUT", parse.number(float, 0, 86400)),
    "extra_imports": ("CELERY_HA_EXTRA_IMPORTS", parse.text),
    "default_task": ("CELERY_HA_DEFAULT_TASK", parse.checked(check_task_name)),
    "redis_server": ("CELERY_HA_REDIS_SERVER", parse.text),
    "sentinel_master": ("CELERY_HA_SENTINEL_MASTER", parse.text),
    "sentinel_password": ("CELERY_HA_SENTINEL_PASSWORD", parse.text),
    "min_replicas": ("CELERY_HA_MIN_REPLICAS", parse.number(int, 0, 16)),
    "replica_timeout": ("CELERY_HA_REPLICA_TIMEOUT", parse.number(float, 0.001, 60)),
    "allow_eviction": ("CELERY_HA_ALLOW_EVICTION", parse.flag),
    "debug": ("CELERY_HA_DEBUG", parse.flag),
    "obey_robots": ("CELERY_HA_OBEY_ROBOTS", parse.flag),
    "direct_when_empty": ("CELERY_HA_DIRECT_WHEN_EMPTY", parse.flag),
    "flower_auth": ("CELERY_HA_FLOWER_AUTH", parse.basic_auth),
    "batch": ("CELERY_HA_BATCH", parse.batch),
    "chain": ("CELERY_HA_CHAIN", parse.number(float, 0, 60)),
    "script_push": ("CELERY_HA_SCRIPT_PUSH", parse.flag),
    "web_auth": ("CELERY_HA_WEB_AUTH", parse.text),
    "web_namespaces": ("CELERY_HA_WEB_NAMESPACES", parse_namespaces),
    "shards": ("CELERY_HA_SHARDS", parse.number(int, 1, 256)),  # state/shards.py MAX_SHARDS
    "dedup_ttl": ("CELERY_HA_DEDUP_TTL", parse.expiry),
    "broker_timeout": ("CELERY_HA_BROKER_TIMEOUT", parse.number(float, 0.1, 300)),
    "hosts": ("CELERY_HA_HOSTS", parse.flag),
    "host_rate": ("CELERY_HA_HOST_RATE", parse.optional_rate),
    "host_delay": ("CELERY_HA_HOST_DELAY", parse.number(float, 0, 86400)),
    "host_concurrency": ("CELERY_HA_HOST_CONCURRENCY", parse.number(int, 0, 1_000_000)),
    "host_crawl_delay_max": ("CELERY_HA_HOST_CRAWL_DELAY_MAX", parse.number(float, 0, 86400)),
    "robots_ttl": ("CELERY_HA_ROBOTS_TTL", parse.number(float, 1, 86400)),
    "url_keep_fragments": ("CELERY_HA_URL_KEEP_FRAGMENTS", parse.flag),
    "url_strip_params": ("CELERY_HA_URL_STRIP_PARAMS", parse.strip_params),
    "validators_max": ("CELERY_HA_VALIDATORS_MAX", parse.number(int, 0, 1_000_000_000)),
}


#: ``CELERY_HA_*`` variables that are no knob of the table above, by prefix: what each family is
#: (None: read from the environment elsewhere, not named in the warning).
ENV_FAMILIES: dict[str, str | None] = {
    "CELERY_HA_TEST_": None,  # the test suite's own (tests/), e.g. CELERY_HA_TEST_REDIS_URL
    # contrib/scrapy/config.py SCRAPY_PREFIX: read from Scrapy's settings only
    "CELERY_HA_SCRAPY_": "a Scrapy setting, read from the Scrapy project's settings (settings.py, "
                         "custom_settings, scrapy crawl -s NAME=VALUE), not from the environment",
}
_PREFIX = "CELERY_HA_"
#: Whether this process has looked at its environment's CELERY_HA_* variables (once per process; a
#: forked pool child inherits the answer).
_env_checked: list[bool] = []


def field_of_variable(var: str) -> str | None:
    """The knob (``init_app`` keyword) a variable sets: ``CELERY_HA_LEASE_TTL`` -> ``lease_ttl``."""
    return next((name for name, (known, _) in _ENV.items() if known == var), None)


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """A line for each ``CELERY_HA_*`` variable of ``env`` that celery-ha does not read from the
    environment, with the closest knob when one is close (a typo must not be silently ignored)."""
    known = {var.removeprefix(_PREFIX) for var, _ in _ENV.values() if var.startswith(_PREFIX)}
    lines = []
    for name in sorted(n for n in env if n.startswith(_PREFIX) and n.removeprefix(_PREFIX) not in known):
        family = next((prefix for prefix in ENV_FAMILIES if name.startswith(prefix)), None)
        if family is not None:
            if ENV_FAMILIES[family]:
                lines.append(f"environment variable {name} is {ENV_FAMILIES[family]}: celery-ha ignores it")
            continue
        close = difflib.get_close_matches(name.removeprefix(_PREFIX), sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean {_PREFIX}{close[0]}?" if close else ""
        lines.append(f"unknown environment variable {name} (celery-ha ignores it){hint}")
    return lines


def warn_unknown_variables() -> None:
    """Log :func:`unknown_variables` of this process's environment, the first time only."""
    if _env_checked:
        return
    _env_checked.append(True)
    for line in unknown_variables(os.environ):
        log.warning("celery-ha: %s", line)


@dataclass(frozen=True)
class Settings:
    """Validated settings. ``from_env`` is the one way to build it from the outside world."""

    redis_url: str | None = None  # CELERY_HA_REDIS_URL; None = the embedded Redis, if CELERY_HA_EMBEDDED
    # CELERY_HA_EMBEDDED: with no CELERY_HA_REDIS_URL, use (and start) the local embedded Redis. Off by
    # default, so a production process with a missing URL refuses to start instead of working alone on
    # a private Redis; `celery-ha demo` and `up` set it for their children.
    embedded: bool = False
    broker_url: str | None = None  # CELERY_BROKER_URL; None = the same Redis as the state layer
    namespace: str = "default"  # CELERY_HA_NAMESPACE
    # CELERY_HA_NAMESPACES, "shop,news" or "crawl-*" (every registered namespace it matches): the
    # namespaces one worker or beat serves; empty = CELERY_HA_NAMESPACE's. The process's own (the CLI's,
    # pump_now's) is CELERY_HA_NAMESPACE if given (listed or matched), else the first name listed.
    namespaces: tuple[str, ...] = ()
    # CELERY_HA_DISCOVERY_INTERVAL, seconds between two looks for namespaces the patterns match
    discovery_interval: float = 10.0
    lease_ttl: float = 30.0  # CELERY_HA_LEASE_TTL, seconds
    heartbeat_interval: float = 5.0  # CELERY_HA_HEARTBEAT_INTERVAL, seconds
    reclaim_interval: float = 10.0  # CELERY_HA_RECLAIM_INTERVAL, seconds
    max_attempts: int = 3  # CELERY_HA_MAX_ATTEMPTS
    max_stalls: int = 3  # CELERY_HA_MAX_STALLS
    window: int = 0  # CELERY_HA_WINDOW; 0 = 2 x worker concurrency
    checkpoint_every: int = 50  # CELERY_HA_CHECKPOINT_EVERY, items
    task_time_limit: float = 600.0  # CELERY_HA_TASK_TIME_LIMIT, seconds (hard limit of a fetch task)
    visibility_timeout: float = 3600.0  # CELERY_HA_VISIBILITY_TIMEOUT, seconds (Redis broker)
    proxy_rate: tuple[int, float] = (5, 60.0)  # CELERY_HA_PROXY_RATE, "5/60"
    # CELERY_HA_PROXY_DOMAIN_RATES, "example.com=2/10,shop.example=10/60": per-domain overrides
    proxy_domain_rates: dict[str, tuple[int, float]] = field(default_factory=dict)
    proxy_check_url: str = ""  # CELERY_HA_PROXY_CHECK_URL: page the health check fetches through proxies
    data_dir: str = ".celery-ha"  # CELERY_HA_DATA_DIR, embedded Redis files
    redispatch_after: float = 60.0  # CELERY_HA_REDISPATCH_AFTER, seconds a dispatched task may stay unclaimed
    soft_shutdown_timeout: float = 10.0  # CELERY_HA_SOFT_SHUTDOWN_TIMEOUT, seconds tasks get on SIGTERM
    extra_imports: str = ""  # CELERY_HA_EXTRA_IMPORTS, comma-separated task modules for the worker
    default_task: str = "fetch_page"  # CELERY_HA_DEFAULT_TASK: the task of an enqueue that names none
    redis_server: str = ""  # CELERY_HA_REDIS_SERVER: redis-server binary for the embedded Redis and tests
    sentinel_master: str = ""  # CELERY_HA_SENTINEL_MASTER: the master's name, with sentinel:// URLs
    # CELERY_HA_SENTINEL_PASSWORD: AUTH for sentinels that require it
    sentinel_password: str = field(default="", repr=False)
    min_replicas: int = 0  # CELERY_HA_MIN_REPLICAS: replicas that must hold each transition (Redis WAIT)
    replica_timeout: float = 1.0  # CELERY_HA_REPLICA_TIMEOUT, seconds one WAIT may take
    allow_eviction: bool = False  # CELERY_HA_ALLOW_EVICTION: start workers on an evicting Redis anyway
    debug: bool = False  # CELERY_HA_DEBUG: the CLI prints tracebacks
    obey_robots: bool = True  # CELERY_HA_OBEY_ROBOTS: ctx.fetch honours robots.txt (cached per domain)
    direct_when_empty: bool = False  # CELERY_HA_DIRECT_WHEN_EMPTY: fetch directly when every proxy is out
    # CELERY_HA_FLOWER_AUTH, "user:password": Flower's basic auth in `celery-ha up`; "" = generated once
    flower_auth: str = field(default="", repr=False)
    # CELERY_HA_BATCH, "20" or "name=50,*=5": durable task ids per Celery message (default 1)
    batch: dict[str, int] = field(default_factory=dict)
    # CELERY_HA_CHAIN, seconds: a pool process that completes a task takes the next queued one of the
    # same name itself, in the completion's script, for up to this long per message (0 = never;
    # integration/running/chain.py); None = chain_seconds decides
    chain: float | None = None
    # CELERY_HA_SCRIPT_PUSH: a completion's script pushes the refill's messages onto a Redis broker
    # on the state's server itself (integration/dispatch/script_push.py); 0 = always publish from Python
    script_push: bool = True
    # CELERY_HA_WEB_AUTH, "user:password": `celery-ha web`'s basic auth (checked by the web command)
    web_auth: str = field(default="", repr=False)
    # CELERY_HA_WEB_NAMESPACES, "shop,news": the namespaces one `celery-ha web` serves (metrics of
    # all, the dashboard of each with ?namespace=); empty = the one namespace of CELERY_HA_NAMESPACE
    web_namespaces: tuple[str, ...] = ()
    # CELERY_HA_SHARDS: hash tags one namespace's tasks spread over (1 = one tag, one cluster slot)
    shards: int = 1
    # CELERY_HA_DEDUP_TTL, "7d": how long a finished URL stays a duplicate (later, enqueueing it
    # again crawls it again; the sweep forgets older ids); None ("never") = forever
    dedup_ttl: float | None = None
    # CELERY_HA_BROKER_TIMEOUT, seconds: how long one call to a Redis broker may take (socket and
    # connect timeouts, health-check interval); None = derived from the lease TTL
    # (``integration/dispatch/broker.py`` ``broker_timeout``)
    broker_timeout: float | None = None
    # The host gate (state/hosts.py). CELERY_HA_HOSTS: queue tasks per host and hand them out only
    # when their host is eligible; also on when a default below is set, or once any host got a
    # setting or a block (it is recorded in Redis). A sharded namespace needs it in every process.
    hosts: bool = False
    host_rate: tuple[int, float] | None = None  # CELERY_HA_HOST_RATE, "2/1": every host's default rate
    host_delay: float = 0.0  # CELERY_HA_HOST_DELAY, seconds between two tasks of one host (default)
    host_concurrency: int = 0  # CELERY_HA_HOST_CONCURRENCY: tasks of one host at once (0 = no limit)
    host_crawl_delay_max: float = 30.0  # CELERY_HA_HOST_CRAWL_DELAY_MAX: cap of a robots Crawl-delay
    # CELERY_HA_ROBOTS_TTL, seconds a site's robots.txt is trusted, fleet-wide (at most a day, RFC 9309
    # §2.4); an unreachable one (5xx, no answer) is held min(60 s, this) before it is asked again
    robots_ttl: float = 3600.0
    # URL canonicalisation for dedup (base/urls.py), the same in every process of a namespace (the
    # state layer records non-default rules in Redis and refuses a process that differs).
    # CELERY_HA_URL_KEEP_FRAGMENTS: '#fragment' is part of the URL (default: dropped)
    url_keep_fragments: bool = False
    # CELERY_HA_URL_STRIP_PARAMS, "utm_*,gclid,ref" or "none": query parameters dropped (default
    # base/urls.py TRACKING_PARAMS)
    url_strip_params: tuple[str, ...] = UrlRules().strip_params
    # CELERY_HA_VALIDATORS_MAX: ETag / Last-Modified validators kept per shard for conditional
    # requests of a task's own page (state/validators.py); 0 = no conditional requests
    validators_max: int = 1_000_000

    @property
    def served_namespaces(self) -> tuple[str, ...]:
        """Every namespace named for a worker or beat of these settings, its own first."""
        return (self.namespace, *(ns for ns in namespace_names(self.namespaces) if ns != self.namespace))

    @property
    def namespace_patterns(self) -> tuple[str, ...]:
        """The patterns of CELERY_HA_NAMESPACES (``crawl-*``), served beside the names."""
        return namespace_patterns(self.namespaces)

    def serves(self, namespace: str) -> bool:
        """Whether a worker or beat of these settings serves ``namespace`` (named, or matched)."""
        return namespace in self.served_namespaces or _matches(namespace, self.namespace_patterns)

    @property
    def host_gate(self) -> bool:
        """Whether this process switches the host gate on (CELERY_HA_HOSTS or a host default)."""
        return self.hosts or self.host_rate is not None or self.host_delay > 0 or self.host_concurrency > 0

    @property
    def url_rules(self) -> UrlRules:
        """The URL canonicalisation rules of these settings (``base/urls.py``)."""
        return UrlRules(self.url_keep_fragments, self.url_strip_params)

    def batch_size(self, task: str) -> int:
        """Ids one Celery message of ``task`` carries (``CELERY_HA_BATCH``; 1 when unset)."""
        return self.batch.get(task, self.batch.get("*", 1))

    @property
    def chain_seconds(self) -> float:
        """How long a pool process may chain tasks per message: ``CELERY_HA_CHAIN``, else 1 s, and 0
        for a worker serving namespaces by a pattern (those it serves are found as it runs, so a
        chain could not tell whether one of them has work waiting: integration/running/chain.py)."""
        if self.chain is not None:
            return self.chain
        return 0.0 if self.namespace_patterns else 1.0

    @property
    def largest_batch(self) -> int:
        return max(self.batch.values(), default=1)

    @property
    def task_soft_time_limit(self) -> float:
        """The durable tasks' soft time limit: 10 % of the hard one (at most 30 s) before it, at least
        1 s, so a task can still save a checkpoint and hand back before it is killed."""
        return max(1.0, self.task_time_limit - min(30.0, self.task_time_limit / 10))


    def __repr__(self) -> str:
        """Every field but the secrets, URLs with their passwords masked: safe to log."""
        shown = []
        for f in fields(self):
            if not f.repr:
                continue
            value = getattr(self, f.name)
            shown.append(f"{f.name}={mask_url(value)!r}" if isinstance(value, str) else f"{f.name}={value!r}")
        return f"Settings({', '.join(shown)})"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, django: bool | None = None) -> Settings:
        """Settings from the environment (or ``env``), then Django settings (the ``CELERY_HA`` dict) for
        what it leaves unset; ``django`` says whether to read Django (default: only without ``env``)."""
        if env is None:
            warn_unknown_variables()
        values: dict[str, Any] = {}
        for f in fields(cls):
            spec = _ENV.get(f.name)
            if spec is None:
                continue
            var, parse = spec
            text = raw_setting(var, env, django)
            if text is not None:
                values[f.name] = parse(var, text.strip())
        if namespace_names(values.get("namespaces", ())) and "namespace" not in values:
            values["namespace"] = namespace_names(values["namespaces"])[0]
        settings = cls(**values)
        settings.validate()
        return settings

    @classmethod
    def from_overrides(cls, values: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Settings:
        """Settings from a framework's configuration (Django's ``CELERY_HA`` dict, Scrapy settings).

        Keys are variable names (``CELERY_HA_REDIS_URL``, ``CELERY_BROKER_URL``) or short names
        (``REDIS_URL``, ``BROKER_URL``); values are strings or plain numbers/booleans. The environment
        still wins, so one deployment can override a checked-in settings file. An unknown key raises
        :class:`ConfigurationError` naming it (a typo must not be silently ignored).
        """
        variables = [var for var, _ in _ENV.values()]
        short = {var.removeprefix("CELERY_HA_").removeprefix("CELERY_"): var for var in variables}
        by_name = {**{var: var for var in variables}, **short}
        merged: dict[str, str] = {}
        for key, value in values.items():
            var = by_name.get(str(key).upper())
            if var is None:
                raise ConfigurationError(f"unknown celery-ha setting {key!r}; known: "
                                         + ", ".join(sorted(short)))
            if value is None:
                continue
            if isinstance(value, (list, tuple)):  # NAMESPACES=["shop", "news"]
                merged[var] = ",".join(str(v) for v in value)
            else:
                merged[var] = ("1" if value else "0") if isinstance(value, bool) else str(value)
        if env is None:
            warn_unknown_variables()
        source = os.environ if env is None else env
        merged.update({var: text for var in by_name.values() if (text := source.get(var))})
        return cls.from_env(merged, django=env is None)

    @classmethod
    def one(cls, name: str, env: Mapping[str, str] | None = None) -> Any:
        """One knob by field name, parsed and validated alone: for code that needs a single value
        (the redis-server binary, the CLI's debug flag) and must not fail on an unrelated bad knob."""
        var, parse = _ENV[name]
        text = raw_setting(var, env)
        if text is None:
            return next(f.default for f in fields(cls) if f.name == name)
        return parse(var, text.strip())

    def validate(self) -> None:
        """Cross-field checks (each knob alone was checked while parsing)."""
        names = namespace_names(self.namespaces)
        if names and self.namespace not in names and not _matches(self.namespace, self.namespace_patterns):
            raise ConfigurationError(
                f"CELERY_HA_NAMESPACE={self.namespace} is not one of CELERY_HA_NAMESPACES "
                f"({','.join(self.namespaces)}): list it there, or leave CELERY_HA_NAMESPACE unset "
                "(the first listed is then the process's own)")
        if self.heartbeat_interval >= self.lease_ttl:
            raise ConfigurationError(
                f"CELERY_HA_HEARTBEAT_INTERVAL ({self.heartbeat_interval}) must be shorter than "
                f"CELERY_HA_LEASE_TTL ({self.lease_ttl}), or every lease expires between renewals"
            )
        for var, url in (("CELERY_HA_REDIS_URL", self.redis_url), ("CELERY_BROKER_URL", self.broker_url)):
            if url and url.strip().lower().startswith("sentinel://") and not self.sentinel_master:
                raise ConfigurationError(f"{var} names sentinels: set CELERY_HA_SENTINEL_MASTER to the "
                                         "name of the master they watch")

    def env_names(self) -> dict[str, str]:
        """Field name -> environment variable, for documentation and error messages."""
        return {k: v[0] for k, v in _ENV.items()}
