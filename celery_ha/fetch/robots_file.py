"""One origin's robots.txt as read: what the fleet shares in Redis (``fetch/robots.py``).

An answer is a verdict (the rules of a 2xx, allow-all, deny-all, or unreachable), the HTTP status it
came from, when it was fetched, and for a 2xx the text, at most ``ROBOTS_MAX_BYTES`` of it. Stored as
one string: a header line ``R1 <verdict> <status|-> <fetched-at ms> <t|z>`` and the text, plain
(``t``) or zlib-compressed and base64-encoded (``z``, when that is at least a quarter smaller: the
state client decodes replies as UTF-8, so the bytes travel as base64).

Only the text is stored: each process reads it with Protego (Scrapy's parser), which matches as RFC
9309 §2.2 says: the agent's own group (its product token, case-insensitive, at a token boundary;
groups of one agent merged), else the ``*`` groups; the most specific (longest) matching rule wins,
Allow on a tie; ``*`` and a final ``$`` in a path are wildcards; ``/robots.txt`` is always allowed.
The standard library's parser took the first matching rule and matched ``*`` and ``$`` literally.
"""

from __future__ import annotations

import base64
import binascii
import time
import zlib
from dataclasses import dataclass

from protego import Protego

#: Bytes of a robots.txt read and parsed at most (RFC 9309 §2.5: at least 500 KiB).
ROBOTS_MAX_BYTES = 512 * 1024
#: Verdicts: the 2xx file's rules; no rules (other 4xx, no file); nothing allowed (401/403);
#: unreachable (5xx, transport: the pages wait).
RULES, ALLOW, DENY, UNREACHABLE = "rules", "allow", "deny", "unreachable"
_VERDICTS = (RULES, ALLOW, DENY, UNREACHABLE)
_FORMAT = "R1"
#: Texts shorter than this are stored plain (compressing them saves too little to pay for itself).
_PACK_FROM = 512


@dataclass(frozen=True)
class RobotsFile:
    """One robots.txt answer (``fetched_at``: wall-clock seconds of the fetch)."""

    verdict: str
    status: int | None
    fetched_at: float
    text: str = ""

    @classmethod
    def of(cls, verdict: str, status: int | None) -> RobotsFile:
        """An answer without rules, fetched now."""
        return cls(verdict, status, time.time())

    @classmethod
    def from_answer(cls, status: int, body: bytes) -> RobotsFile:
        """The answer of an HTTP ``status`` with ``body`` (read at most ROBOTS_MAX_BYTES of it)."""
        if 200 <= status < 300:
            return cls(RULES, status, time.time(), robots_text(body))
        if status in (401, 403):
            return cls(DENY, status, time.time())
        if status >= 500:
            return cls(UNREACHABLE, status, time.time())
        return cls(ALLOW, status, time.time())

    @property
    def reason(self) -> str:
        return f"HTTP {self.status}" if self.status else "no answer"

    def same(self, other: RobotsFile) -> bool:
        """Whether ``other`` is this very fetch (so a parsed copy of it can be kept)."""
        return (self.verdict, self.status, int(self.fetched_at * 1000)) == (
            other.verdict, other.status, int(other.fetched_at * 1000))

    def rules(self, agent: str) -> RobotsRules:
        """What this answer lets ``agent`` fetch (parsed once: the copy a process keeps)."""
        return RobotsRules(self, agent)

    def encode(self) -> str:
        body, form = self.text, "t"
        if len(body) >= _PACK_FROM:
            packed = base64.b64encode(zlib.compress(body.encode("utf-8"), 6)).decode("ascii")
            if len(packed) <= len(body) * 3 // 4:
                body, form = packed, "z"
        status = "-" if self.status is None else str(self.status)
        return f"{_FORMAT} {self.verdict} {status} {int(self.fetched_at * 1000)} {form}\n{body}"

    @classmethod
    def decode(cls, value: str) -> RobotsFile | None:
        """The answer :meth:`encode` stored; None for anything else (read as a miss: fetched again)."""
        head, _, body = value.partition("\n")
        fields = head.split(" ")
        if len(fields) != 5 or fields[0] != _FORMAT or fields[1] not in _VERDICTS:
            return None
        try:
            status = None if fields[2] == "-" else int(fields[2])
            fetched_at = int(fields[3]) / 1000.0
            if fields[4] == "z":
                body = zlib.decompress(base64.b64decode(body, validate=True)).decode("utf-8")
            elif fields[4] != "t":
                return None
        except (ValueError, binascii.Error, zlib.error, UnicodeDecodeError):
            return None
        return cls(fields[1], status, fetched_at, body)


class RobotsRules:
    """One answer read for one agent: a 2xx file's rules through Protego, all or nothing for the
    verdicts without rules. 401/403 (DENY) forbids every URL, ``/robots.txt`` too: this crawler's
    choice, stricter than the file's own rules would be. Safe to share between threads (Protego's
    lazily built indexes are only ever replaced by equal ones)."""

    def __init__(self, robots: RobotsFile, agent: str) -> None:
        self.agent = agent
        self._everything = robots.verdict != DENY  # ALLOW; UNREACHABLE never gets asked (the cache raises)
        self._rules = Protego.parse(robots.text) if robots.verdict == RULES else None

    def allowed(self, url: str) -> bool:
        """Whether the agent may fetch ``url`` (a URL of the file's origin)."""
        return self._everything if self._rules is None else self._rules.can_fetch(url, self.agent)

    def crawl_delay(self) -> float | None:
        """The agent's group's ``Crawl-delay`` in seconds; None when it sets none (or a malformed,
        negative or infinite one, which Protego drops)."""
        return None if self._rules is None else self._rules.crawl_delay(self.agent)


def robots_text(body: bytes) -> str:
    """The text to parse from a body read up to ROBOTS_MAX_BYTES: UTF-8 (RFC 9309 §2.3; a BOM is
    dropped, a bad byte replaced); a body that reached the limit was cut, so its last line, maybe
    unfinished, is dropped (a cut ``Allow: /a`` would allow more than the file says)."""
    if len(body) >= ROBOTS_MAX_BYTES:
        body = body[:ROBOTS_MAX_BYTES]
        body = body[: body.rfind(b"\n") + 1]
    return body.decode("utf-8-sig", "replace")
