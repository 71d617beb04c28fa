"""Parse and validate what callers hand the proxy pool: proxy URLs and domains.

Everything is checked in Python before any script runs, so bad input raises :class:`InvalidInput` and
writes nothing. Error messages carry masked URLs only: a typo in a proxy URL must not leak its password
into a log or a CLI error line. Rates are parsed by :func:`celery_ha.base.validation.parse_rate`, the
rule every layer shares.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from celery_ha.base.errors import InvalidInput
from celery_ha.base.hosts import normalize_domain as normalize_domain  # re-exported: the pool's name
from celery_ha.base.hosts import valid_host
from celery_ha.base.masking import mask_url
from celery_ha.base.validation import MAX_URL_BYTES, check_number, check_text
from celery_ha.base.validation import shown as _shown

SCHEMES = ("http", "https", "socks5", "socks5h", "socks4")
#: Longest proxy lifetime or ban a caller may give (seconds): ten years (a permanent ban has no length).
MAX_PROXY_SECONDS = 10 * 365 * 86400
_SESSION_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class ProxySpec:
    """One validated proxy endpoint. ``url`` keeps credentials (workers need them); ``masked`` does not."""

    scheme: str
    host: str
    port: int
    username: str = ""
    password: str = field(default="", repr=False)
    session: str = ""  # sticky-session tag of a tunnel endpoint ("" for ordinary proxies)

    @property
    def id(self) -> str:
        """Stable id: ``host:port`` (plus ``~session`` for a sticky tunnel session). Never credentials."""
        base = f"{self.host}:{self.port}"
        return f"{base}~{self.session}" if self.session else base

    @property
    def url(self) -> str:
        """The URL workers connect through, credentials percent-encoded (never log it: see ``masked``)."""
        auth = ""
        if self.username or self.password:
            auth = (
                f"{_quote(self.username)}:{_quote(self.password)}@"
                if self.password
                else f"{_quote(self.username)}@"
            )
        return f"{self.scheme}://{auth}{self.host}:{self.port}"

    @property
    def masked(self) -> str:
        """The URL with its password replaced by ``***``: the only form shown or stored for display."""
        return mask_url(self.url)

    def __repr__(self) -> str:
        return f"ProxySpec({self.masked!r}, session={self.session!r})"


def _quote(text: str) -> str:
    """Percent-encode a user name or password for the userinfo part of a URL."""
    return quote(text, safe="-._~")


def parse_proxy_url(url: str, *, session: str = "") -> ProxySpec:
    """Validate ``scheme://[user[:pass]@]host:port`` and return a :class:`ProxySpec`.

    A bare ``host:port`` means ``http://host:port`` (what provider APIs and free lists return).
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidInput("proxy URL must be a non-empty string")
    text = url.strip()
    try:
        check_text("proxy URL", text, MAX_URL_BYTES)
    except InvalidInput as exc:  # the message names the character, never the URL (credentials)
        raise InvalidInput(str(exc)) from None
    if "://" not in text:
        text = "http://" + text
    shown = mask_url(text)
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise InvalidInput(f"bad proxy URL {shown!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise InvalidInput(f"bad proxy URL {shown!r}: scheme must be one of {', '.join(SCHEMES)}")
    host = (parts.hostname or "").lower()
    if not host or not valid_host(host):
        raise InvalidInput(f"bad proxy URL {shown!r}: missing or invalid host")
    if port is None or not (1 <= port <= 65535):
        raise InvalidInput(f"bad proxy URL {shown!r}: a port 1-65535 is required")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidInput(f"bad proxy URL {shown!r}: no path, query or fragment allowed")
    if not isinstance(session, str) or (session and not _SESSION_RE.fullmatch(session)):
        raise InvalidInput(f"bad session tag {_shown(session)}: 1-64 letters, digits, '_' or '-'")
    return ProxySpec(
        scheme, host, port, unquote(parts.username or ""), unquote(parts.password or ""), session
    )


def check_exclude(exclude: object) -> str:
    """The ``exclude`` list of acquire as acquire.lua takes it: the proxy ids, space-separated.

    Each id must be a clean string without spaces (a space would split it); a lone string is refused
    (it would be read as its characters)."""
    if not exclude:
        return ""
    ids = _as_list(exclude, "exclude", "proxy ids")
    for pid in ids:
        if not isinstance(pid, str) or not pid or " " in pid:
            raise InvalidInput(f"exclude holds {_shown(pid)}: each must be a proxy id (host:port)")
    joined = " ".join(ids)
    if not (joined.isascii() and joined.isprintable()):
        check_text("exclude", joined, len(joined))
    return joined


def check_specs(specs: object) -> list[ProxySpec]:
    """A batch of validated specs as a list: checked whole before any is written."""
    out = _as_list(specs, "specs", "ProxySpec")
    for spec in out:
        if not isinstance(spec, ProxySpec):
            raise InvalidInput(f"each proxy must be a ProxySpec, got {type(spec).__name__}")
    return out


def check_lifetimes(ttls: object) -> Mapping[str, float]:
    """Per-id provider lifetimes (seconds, API providers): each finite, 0..MAX_PROXY_SECONDS."""
    lifetimes = ttls or {}
    if not isinstance(lifetimes, Mapping):
        raise InvalidInput(f"ttls must map proxy ids to seconds, got {type(lifetimes).__name__}")
    for life in lifetimes.values():
        check_number("ttl", life, 0, MAX_PROXY_SECONDS)
    return lifetimes


def _as_list(value: object, name: str, what: str) -> list[Any]:
    """``value`` as a list of its items; a lone string (read as its characters) or a non-iterable is
    refused in one line naming ``name`` and ``what`` it must hold."""
    if isinstance(value, (str, bytes)):
        raise InvalidInput(f"{name} must be a list of {what}, not one string")
    try:
        return list(value)  # type: ignore[call-overload]
    except TypeError:
        raise InvalidInput(f"{name} must be a list of {what}, got {type(value).__name__}") from None
