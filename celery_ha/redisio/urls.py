"""Redis URLs: the schemes celery-ha accepts, and credential masking for anything printed or logged.

AUTH, ACL users and TLS all come through the URL (``redis://user:pass@host:6379/0``, ``rediss://…``),
which redis-py understands natively; celery-ha adds nothing of its own there.
"""

from __future__ import annotations

import re

_CREDENTIALS_IN_TEXT = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<cred>[^/@\s:]*(?::[^/@\s]*)?)@", re.I)


def mask_url(url: str) -> str:
    """Replace the password of a URL (and any user:pass@ inside free text) by ``***``."""

    def repl(match: re.Match[str]) -> str:
        cred = match.group("cred")
        user = cred.split(":", 1)[0] if ":" in cred else ""
        masked = f"{user}:***" if user else "***"
        return f"{match.group('scheme')}{masked}@"

    return _CREDENTIALS_IN_TEXT.sub(repl, url)
