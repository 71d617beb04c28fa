"""CELERY_HA_NAMESPACES and CELERY_HA_WEB_NAMESPACES: names and patterns of the namespaces one
process serves (``crawl-*``: every registered namespace that matches, ``state/namespaces.py``)."""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

from celery_ha.base.errors import ConfigurationError, InvalidInput
from celery_ha.base.validation import check_namespace


def _checked_name(name: str, text: str) -> str:
    try:
        return check_namespace(text)
    except InvalidInput as exc:
        raise ConfigurationError(f"{name}={text!r}: {exc}") from None


#: Most namespaces one process serves at once (``CELERY_HA_NAMESPACES``, ``CELERY_HA_WEB_NAMESPACES``).
MAX_SERVED_NAMESPACES = 64


def parse_namespaces(name: str, text: str) -> tuple[str, ...]:
    """``"shop, news, crawl-*"`` -> the namespaces one worker, beat or ``celery-ha web`` serves: names
    (each checked) and patterns (``*`` and ``?`` of a shell glob, matched against the namespaces
    registered in Redis, ``state/namespaces.py``); no repeats."""
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if len(names) > MAX_SERVED_NAMESPACES:
        raise ConfigurationError(f"{name} names {len(names)} namespaces; at most {MAX_SERVED_NAMESPACES}")
    return tuple(n if is_namespace_pattern(n, name) else _checked_name(name, n) for n in names)


_PATTERN = re.compile(r"[A-Za-z0-9_.*?-]{1,64}")


def is_namespace_pattern(entry: str, name: str = "CELERY_HA_NAMESPACES") -> bool:
    """Whether an entry of CELERY_HA_NAMESPACES is a pattern (``crawl-*``, ``*``) rather than a name;
    a pattern of other characters than a namespace's and ``*``/``?`` is refused."""
    if "*" not in entry and "?" not in entry:
        return False
    if not _PATTERN.fullmatch(entry):
        raise ConfigurationError(f"{name}: pattern {entry!r} may hold only letters, digits, '_', '.', "
                                 "'-' and the wildcards '*' and '?'")
    return True


def namespace_names(entries: tuple[str, ...]) -> tuple[str, ...]:
    """The names among CELERY_HA_NAMESPACES's entries (not the patterns)."""
    return tuple(e for e in entries if "*" not in e and "?" not in e)


def namespace_patterns(entries: tuple[str, ...]) -> tuple[str, ...]:
    """The patterns among CELERY_HA_NAMESPACES's entries."""
    return tuple(e for e in entries if "*" in e or "?" in e)


def matches_namespace_pattern(namespace: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``namespace`` matches one of ``patterns`` (case-sensitive, as Redis keys are)."""
    return any(fnmatchcase(namespace, p) for p in patterns)
