"""Credential masking for anything printed or logged (URLs and free text that may hold them).

AUTH, ACL users and TLS all come through the URL (``redis://user:pass@host:6379/0``, ``rediss://…``),
which redis-py understands natively; celery-ha adds nothing of its own there.

Masking runs on every message, log line and table cell, including ones built from user data (ids,
checkpoints, errors), so it must be linear in its input: see :data:`_CREDENTIALS_IN_TEXT`.
"""

from __future__ import annotations

import re

# What is masked: ``SCHEME://CRED@`` where SCHEME is a letter then letters, digits, '+', '.', '-'
# (RFC 3986), and CRED is ``user``, ``user:password`` or ``:password`` (no '/', '@' or whitespace; the
# user part has no ':'). The scheme taken is the longest one that starts with a letter within the run
# of scheme characters before '://' ("1+abc://" -> "abc://").
#
# Linear time: the lookbehind lets a match start only where a run of scheme characters begins, so
# each run is read once (a pattern that may start anywhere re-reads the rest of the run from every
# position of it: quadratic on 'x' * n). ``lead`` holds the run's characters before its first letter
# and is put back unchanged. A credential part ends at the first '/', and every '://' holds one, so
# the credential parts tried for different '://' never overlap either.
_CREDENTIALS_IN_TEXT = re.compile(
    r"(?<![a-z0-9+.-])(?P<lead>[0-9+.-]*)(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<cred>[^/@\s:]*(?::[^/@\s]*)?)@",
    re.I,
)
# The same scheme rule for a text that ends right after '://' (see mask_prefix).
_ENDS_WITH_SCHEME = re.compile(r"(?<![a-z0-9+.-])[0-9+.-]*[a-z][a-z0-9+.-]*://\Z", re.I)
# A possible (cut) credential part: it runs to the end of the text.
_OPEN_CREDENTIALS = re.compile(r"[^/@\s]*")


def _masked(cred: str) -> str:
    """``user:pass`` -> ``user:***``; ``:pass`` and a lone ``user`` (a token) -> ``***``."""
    user = cred.split(":", 1)[0] if ":" in cred else ""
    return f"{user}:***" if user else "***"


def _repl(match: re.Match[str]) -> str:
    return f"{match.group('lead')}{match.group('scheme')}{_masked(match.group('cred'))}@"


def mask_url(url: str) -> str:
    """Replace the password of a URL (and any user:pass@ inside free text) by ``***``.

    Linear in ``len(url)``; a text without ``://`` is returned as it is after one scan.
    """
    if "://" not in url:
        return url
    return _CREDENTIALS_IN_TEXT.sub(_repl, url)


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
