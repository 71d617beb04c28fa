"""Credential masking for anything printed or logged (URLs and free text that may hold them).

AUTH, ACL users and TLS all come through the URL (``redis://user:pass@host:6379/0``, ``rediss://…``),
which redis-py understands natively; celery-ha adds nothing of its own there. redis-py (and kombu)
also take the credentials as query parameters (``redis://host/0?password=…``, ``?username=…``), and
read the userinfo up to the *last* '@' of the authority (``redis://:p@ss@host`` has the password
``p@ss``): both forms are masked the way those parsers read them.

Masking runs on every message, log line and table cell, including ones built from user data (ids,
checkpoints, errors), so it must be linear in its input: see :data:`_CREDENTIALS_IN_TEXT`.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

# What is masked: ``SCHEME://CRED@`` where SCHEME is a letter then letters, digits, '+', '.', '-'
# (RFC 3986), and CRED is everything of the authority before its LAST '@' (the authority ends at the
# first '/', '?', '#' or whitespace, as urllib.parse splits it, and urllib and redis-py take the
# userinfo up to the last '@' in it): ``user``, ``user:password`` or ``:password``, where the user
# part ends at the first ':' and the password may hold '@' and ':'. The scheme taken is the longest
# one that starts with a letter within the run of scheme characters before '://' ("1+abc://" -> "abc://").
#
# Linear time: the lookbehind lets a match start only where a run of scheme characters begins, so
# each run is read once (a pattern that may start anywhere re-reads the rest of the run from every
# position of it: quadratic on 'x' * n). ``lead`` holds the run's characters before its first letter
# and is put back unchanged. A credential part ends at the first '/', and every '://' holds one, so
# the credential parts tried for different '://' never overlap (the greedy run backs off to its last
# '@' once, within its own part).
_CREDENTIALS_IN_TEXT = re.compile(
    r"(?<![a-z0-9+.-])(?P<lead>[0-9+.-]*)(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<cred>[^/?#\s]*)@",
    re.I,
)
# A ``key=value`` query parameter (after '?', '&' or ';'). The value runs to the next '&', '#' or
# whitespace, and to a ';' only where another URL starts there (kombu's ``sentinel://a;sentinel://b``).
# Linear: a match starts only right after one of '?&;', which the key cannot hold, so the keys tried
# never overlap; the value's lookahead reads one run of scheme characters, which ends at the next ';'.
_QUERY_PARAMETER = re.compile(
    r"(?<=[?&;])(?P<key>[^=&;#?\s/]*)=(?P<value>(?:(?!;[a-z][a-z0-9+.-]*://)[^&#\s])*)",
    re.I,
)
# Query keys whose value is a credential: redis-py passes every query parameter on to the connection
# (``password``, ``username``), kombu and the Sentinel support read ``sentinel_password`` and the
# like; tokens and API keys of crawled URLs are secrets too. A key is compared by its parts
# (``sentinel_password`` -> sentinel, password), after the percent-decoding parse_qs applies.
_SECRET_KEY_PARTS = frozenset({"password", "passwd", "pass", "pwd", "secret", "token", "username", "user",
                               "auth", "apikey", "credential", "credentials"})
_SECRET_KEYS = frozenset({"api_key", "api-key", "access_key", "access-key", "secret_key", "private_key"})
_KEY_PARTS = re.compile(r"[_.\-\s]+")
# The same scheme rule for a text that ends right after '://' (see mask_prefix).
_ENDS_WITH_SCHEME = re.compile(r"(?<![a-z0-9+.-])[0-9+.-]*[a-z][a-z0-9+.-]*://\Z", re.I)
# A possible (cut) authority: it runs to the end of the text, so any of it may be a credential.
_OPEN_CREDENTIALS = re.compile(r"[^/?#\s]*")


def _masked(cred: str) -> str:
    """``user:pass`` -> ``user:***``; ``:pass`` and a lone ``user`` (a token) -> ``***``."""
    user = cred.split(":", 1)[0] if ":" in cred else ""
    return f"{user}:***" if user else "***"


def _repl(match: re.Match[str]) -> str:
    return f"{match.group('lead')}{match.group('scheme')}{_masked(match.group('cred'))}@"


def secret_query_key(key: str) -> bool:
    """Whether a query parameter named ``key`` carries a credential (see :data:`_SECRET_KEY_PARTS`)."""
    name = unquote_plus(key).strip().lower()
    return name in _SECRET_KEYS or not _SECRET_KEY_PARTS.isdisjoint(_KEY_PARTS.split(name))


def _query_repl(match: re.Match[str]) -> str:
    if not match.group("value") or not secret_query_key(match.group("key")):
        return match.group(0)
    return f"{match.group('key')}=***"


def mask_url(url: str) -> str:
    """Replace the password of a URL (and any user:pass@ inside free text) by ``***``, and the value
    of credential query parameters (``?password=…``) too.

    Linear in ``len(url)``; a text without ``://`` is returned as it is after one scan.
    """
    if "://" not in url:
        return url
    text = _CREDENTIALS_IN_TEXT.sub(_repl, url)
    return _QUERY_PARAMETER.sub(_query_repl, text) if "=" in text else text


def mask_prefix(text: str, limit: int) -> str:
    """:func:`mask_url` of ``text[:limit]``, reading at most ``limit`` characters of ``text``.

    For display paths that show only the start of a possibly huge value. A credential cut by the
    limit (``scheme://user:pa`` with its ``@`` beyond it) is masked as if the ``@`` followed, so the
    shown part never carries the start of a password; the cut is not marked (callers add "…").
    """
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if len(text) <= limit:
        return mask_url(text)
    window = text[:limit]
    cut = window.rfind("://")
    if cut < 0:
        return window  # no '://' in the window: nothing to mask (mask_url would return it as is)
    head, tail = window[: cut + 3], window[cut + 3:]
    # Only the part after the last '://' can be cut: any earlier one is ended by this one's '/'.
    if _OPEN_CREDENTIALS.fullmatch(tail) and _ENDS_WITH_SCHEME.search(head):
        return mask_url(head) + (_masked(tail) if tail else "")
    return mask_url(window)
