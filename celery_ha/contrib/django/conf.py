"""The Django configuration of celery-ha: the ``CELERY_HA`` settings dict, validated once.

``CELERY_HA = {"REDIS_URL": "redis://…", "NAMESPACE": "shop", "LEASE_TTL": 60, …}`` takes every
``CELERY_HA_*`` knob by its short name (or its full variable name); top-level ``CELERY_HA_*`` Django
settings, which celery-ha read before this app existed, count too, below the dict. The environment
wins over both (``Settings.from_overrides``), so one deployment can override a checked-in settings
file. Three keys exist only here: ``EMBEDDED_REDIS``, ``PUSH_TIMEOUT`` and ``RELAY_INTERVAL``.

A web process must not quietly start a local redis-server because a URL is missing: without
``REDIS_URL`` (and without ``CELERY_HA_REDIS_URL`` in the environment) loading fails, unless
``EMBEDDED_REDIS`` asks for the embedded Redis explicitly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from celery_ha.base.errors import ConfigurationError
from celery_ha.base.settings import Settings

#: The keys only the Django app knows, with their defaults.
EMBEDDED_REDIS = "EMBEDDED_REDIS"  # True: use the embedded Redis (development on one machine)
PUSH_TIMEOUT = "PUSH_TIMEOUT"  # seconds a request may wait on Redis (connect, and each reply)
RELAY_INTERVAL = "RELAY_INTERVAL"  # seconds between two beat relays of the outbox
DEFAULTS: dict[str, Any] = {EMBEDDED_REDIS: False, PUSH_TIMEOUT: 1.0, RELAY_INTERVAL: 10.0}
LIMITS = {PUSH_TIMEOUT: (0.01, 30.0), RELAY_INTERVAL: (0.5, 86_400.0)}

_VARIABLE = re.compile(r"\bCELERY_[A-Z_]+\b")


@dataclass(frozen=True)
class DjangoConfig:
    """The validated configuration of one Django process."""

    settings: Settings
    embedded: bool  # EMBEDDED_REDIS
    push_timeout: float  # PUSH_TIMEOUT
    relay_interval: float  # RELAY_INTERVAL
    #: The celery-ha variables this configuration sets, as the environment spells them (for
    #: ``manage.py celery_ha``, whose CLI and child processes read the environment).
    variables: Mapping[str, str]


def variable_names() -> dict[str, str]:
    """Every accepted key (variable name or short name, upper case) -> its variable name, by the
    rule ``Settings.from_overrides`` applies."""
    names: dict[str, str] = {}
    for var in Settings().env_names().values():
        names[var] = var
        names[var.removeprefix("CELERY_HA_").removeprefix("CELERY_")] = var
    return names


def _text(value: Any) -> str:
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


def _flag(key: str, value: Any) -> bool:
    text = _text(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ImproperlyConfigured(f"CELERY_HA[{key!r}]={value!r} must be True or False")


def _seconds(key: str, value: Any) -> float:
    low, high = LIMITS[key]
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ImproperlyConfigured(f"CELERY_HA[{key!r}]={value!r} is not a number of seconds") from None
    if not low <= seconds <= high:
        raise ImproperlyConfigured(f"CELERY_HA[{key!r}]={value!r} must be between {low:g} and {high:g} "
                                   "seconds")
    return seconds


def _named(message: str, written: Mapping[str, str], values: Mapping[str, Any]) -> str:
    """Name the settings key behind the variable an error names, when the bad value is the one that
    key holds (the user wrote the key, not the variable); else the value came from the environment."""
    match = _VARIABLE.search(message)
    if match is None or match.group() not in written:
        return message
    var = match.group()
    if f"{var}={_text(values[var]).strip()!r}" not in message:
        return f"{message} (set in the environment, which wins over CELERY_HA)"
    key = written[var]
    return f"CELERY_HA[{key!r}]: {message}" if key != var else f"settings.{var}: {message}"


def load(django_settings: Any) -> DjangoConfig:
    """Validate the project's settings; ImproperlyConfigured (one line naming the key) if they are bad."""
    raw = getattr(django_settings, "CELERY_HA", None) or {}
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(f"CELERY_HA must be a dict, got {type(raw).__name__}")
    names = variable_names()
    own = dict(DEFAULTS)
    core: dict[str, Any] = {}
    written: dict[str, str] = {}  # variable -> the key the user wrote
    for var in names.values():  # the older top-level CELERY_HA_* settings, below the dict
        value = getattr(django_settings, var, None)
        if value is not None:
            core[var], written[var] = value, var
    for key, value in raw.items():
        upper = str(key).upper()
        if upper in DEFAULTS:
            own[upper] = value
        elif upper in names:
            core[names[upper]], written[names[upper]] = value, str(key)
        else:
            short = (name for name, var in names.items() if name != var)
            raise ImproperlyConfigured(f"CELERY_HA: unknown key {key!r}; known: "
                                       + ", ".join(sorted({*DEFAULTS, *short})))
    try:
        settings = Settings.from_overrides(core)
    except ConfigurationError as exc:
        raise ImproperlyConfigured(_named(str(exc), written, core)) from None
    embedded = _flag(EMBEDDED_REDIS, own[EMBEDDED_REDIS]) or settings.embedded
    if not settings.redis_url and not embedded:
        raise ImproperlyConfigured(
            "celery-ha has no Redis: set CELERY_HA = {'REDIS_URL': 'redis://host:6379/0', ...} (or "
            "CELERY_HA_REDIS_URL in the environment); for development on one machine, "
            "CELERY_HA['EMBEDDED_REDIS'] = True starts the local embedded Redis instead")
    variables = {var: _text(value) for var, value in core.items() if value is not None}
    return DjangoConfig(settings=settings, embedded=embedded,
                        push_timeout=_seconds(PUSH_TIMEOUT, own[PUSH_TIMEOUT]),
                        relay_interval=_seconds(RELAY_INTERVAL, own[RELAY_INTERVAL]),
                        variables=variables)
