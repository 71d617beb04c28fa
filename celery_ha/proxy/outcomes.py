"""What happened to a request, in the words ``release.lua`` folds into a proxy's score and bans.

The HTTP statuses that decide an outcome by themselves are mapped once, in :func:`status_outcome`:
the fetcher's response classifier and the pool's simple ``ok``/``status`` release form both use it,
so a status can never count as a block in one place and as a success in the other.
"""

from __future__ import annotations

#: Every outcome release accepts: ``ok`` and ``permanent`` (the page is gone, the proxy worked) are
#: successes; ``blocked`` bans the proxy for one domain; ``server`` (5xx) is the site's trouble;
#: ``transport`` counts against the proxy everywhere; ``aborted`` and ``unused`` judge nothing.
OUTCOMES = ("ok", "permanent", "blocked", "server", "transport", "aborted", "unused")
#: The site refused this exit IP (auth wall, forbidden, rate limited).
BLOCK_STATUSES = frozenset({401, 403, 429})
#: The page is gone: retrying through another proxy cannot help.
PERMANENT_STATUSES = frozenset({404, 410})
#: Proxy Authentication Required: the proxy refused our credentials, the site never saw the request.
PROXY_AUTH_STATUS = 407


def status_outcome(status: int | None) -> str | None:
    """The outcome an HTTP status decides on its own, or None when the status alone does not decide
    (2xx/3xx, other 4xx, or no status): callers then look at the body or at their ``ok`` flag."""
    if status is None:
        return None
    if status in PERMANENT_STATUSES:
        return "permanent"
    if status in BLOCK_STATUSES:
        return "blocked"
    if status == PROXY_AUTH_STATUS:
        return "transport"
    if status >= 500:
        return "server"
    return None


def outcome_for(ok: bool | None, status: int | None) -> str:
    """Map the simple ``ok``/``status`` form of release onto an outcome name.

    A gone page stays ``permanent`` even when the caller says ok; otherwise ``ok=True`` wins over the
    status. Without any status (None or 0) the request never got an answer: a transport failure.
    """
    decided = status_outcome(status)
    if decided == "permanent":
        return decided
    if ok:
        return "ok"
    if decided is not None:
        return decided
    if not status:
        return "transport"
    return "blocked" if ok is False else "ok"
