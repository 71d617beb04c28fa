"""How each setting's text becomes its value (the parsers of ``settings.py``'s table): every one
raises :class:`ConfigurationError` naming the variable, so a process stops at start-up with one line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from celery_ha.base.errors import ConfigurationError, InvalidInput
from celery_ha.base.masking import mask_url
from celery_ha.base.urls import check_param_patterns
from celery_ha.base.validation import check_task_name, parse_duration, parse_rate


def number(kind: Callable[[str], Any], minimum: float, maximum: float) -> Callable[[str, str], Any]:
    def parse(name: str, text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise ConfigurationError(f"{name}={text!r} is not a {kind.__name__}") from None
        if not (minimum <= value <= maximum):
            raise ConfigurationError(f"{name}={text!r} must be between {minimum} and {maximum}")
        return value

    return parse


def checked(check: Callable[[str], Any]) -> Callable[[str, str], Any]:
    """A knob parser from an input check of ``celery_ha.base.validation`` (the rule lives there)."""

    def parse(name: str, text: str) -> Any:
        try:
            return check(text)
        except InvalidInput as exc:
            raise ConfigurationError(f"{name}={text!r}: {exc}") from None

    return parse


#: The schemes of a state-layer Redis URL (celery_ha/redisio/client.py reads each).
REDIS_URL_SCHEMES = ("redis", "rediss", "unix", "sentinel", "redis+cluster", "rediss+cluster")


def check_redis_url(text: str, name: str = "Redis URL") -> str:
    """A Redis URL whose scheme celery-ha reads and whose database, if given, is a number: checked at
    start-up rather than at the first connection (a worker would stop there with a traceback, and
    redis-py quietly reads a database that is no number as database 0)."""
    parts = urlsplit(text.strip())
    if parts.scheme.lower() not in REDIS_URL_SCHEMES:
        raise ConfigurationError(f"{name}={mask_url(text)!r}: use one of " + ", ".join(
            f"{s}://" for s in REDIS_URL_SCHEMES))
    if parts.scheme.lower() in ("redis", "rediss"):
        database = parts.path.strip("/") or parse_qs(parts.query).get("db", ["0"])[0]
        if not database.isdigit():
            raise ConfigurationError(
                f"{name}={mask_url(text)!r}: the database ({database!r}) must be a number")
    return text


def redis_url(name: str, text: str) -> str:
    return check_redis_url(text, name)


def domain_rates(name: str, text: str) -> dict[str, tuple[int, float]]:
    """``"example.com=2/10, shop.example=10/60"`` -> {domain: (requests, seconds)}; domains are
    normalized by the proxy pool, which owns the domain rule."""
    rates: dict[str, tuple[int, float]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        domain, sep, rate = part.partition("=")
        if not sep or not domain.strip():
            raise ConfigurationError(f"{name} entry {part!r} must be DOMAIN=N/SECONDS")
        rates[domain.strip()] = checked(parse_rate)(name, rate.strip())
    return rates


MAX_BATCH_IDS = 1000


def batch(name: str, text: str) -> dict[str, int]:
    """``"20"`` (every durable task) or ``"bench_noop=50, fetch_page=5"`` (per task name; ``*=N`` sets
    the default) -> {task name or "*": ids per Celery message}."""
    sizes: dict[str, int] = {}
    parse = number(int, 1, MAX_BATCH_IDS)
    for part in filter(None, (p.strip() for p in text.split(","))):
        task, sep, size = part.rpartition("=")
        task = task.strip() if sep else "*"
        if task != "*":
            checked(check_task_name)(name, task)
        sizes[task] = parse(name, size.strip())
    return sizes


def optional_rate(name: str, text: str) -> tuple[int, float] | None:
    """``"2/1"`` -> (2, 1.0); ``""``, ``none`` or ``off`` -> None (no rate)."""
    if text.strip().lower() in ("", "none", "off"):
        return None
    return checked(parse_rate)(name, text)


def expiry(name: str, text: str) -> float | None:
    """A duration (``"7d"``, ``"3600"``), or ``never`` (also ``forever``, ``off``) -> None."""
    if text.strip().lower() in ("never", "forever", "off"):
        return None
    return checked(parse_duration)(name, text)


def strip_params(name: str, text: str) -> tuple[str, ...]:
    """``"utm_*, gclid, ref"`` -> the query parameters canonical URLs drop; ``none`` -> none."""
    if text.strip().lower() in ("none", "off"):
        return ()
    return checked(check_param_patterns)(name, text)


def text(name: str, text: str) -> str:
    return text


def basic_auth(name: str, text: str) -> str:
    """``user:password`` (or several, comma-separated), as Flower's ``--basic-auth`` takes them."""
    for part in text.split(","):
        user, sep, password = part.partition(":")
        if not (sep and user.strip() and password):
            raise ConfigurationError(f"{name} must be USER:PASSWORD (several: comma-separated); "
                                     "got an entry without a user or a password")
    return text


def flag(name: str, text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{name}={text!r} must be one of 1/0, true/false, yes/no, on/off")
