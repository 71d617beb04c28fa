"""Basic auth for ``celery-ha web``, and the token that keeps its actions safe from cross-site requests.

A browser sends basic-auth credentials with every request to the site, including one a hostile page
makes it send (a form POSTed cross-site). Actions therefore also need an ``X-CSRF-Token`` header: a
page of another origin can neither read the token (the same-origin policy hides the dashboard's
responses from it) nor send a custom header without a CORS preflight, which this server never
grants. The token is derived from the credentials, so every ``celery-ha web`` process started with the
same ``--auth`` accepts it: the processes stay stateless behind a load balancer.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass, field

from celery_ha.base.errors import InvalidInput

#: Longest user or password accepted (a header is bounded anyway; this keeps errors readable).
MAX_CREDENTIAL_CHARS = 256


@dataclass(frozen=True)
class BasicAuth:
    """One ``user:password`` pair; the password never appears in ``repr``."""

    user: str
    password: str = field(repr=False)

    @classmethod
    def parse(cls, text: str) -> BasicAuth:
        """``USER:PASSWORD`` (the password may hold ':'); InvalidInput, never echoing the text."""
        user, sep, password = text.partition(":")
        if not sep or not user or not password:
            raise InvalidInput("must be USER:PASSWORD with a non-empty user and password")
        if len(user) > MAX_CREDENTIAL_CHARS or len(password) > MAX_CREDENTIAL_CHARS:
            raise InvalidInput(f"user and password must be at most {MAX_CREDENTIAL_CHARS} characters")
        if not (user + password).isprintable() or " " in user:
            raise InvalidInput("user and password must be printable, and the user without spaces")
        return cls(user, password)

    def check(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries these credentials (constant-time compare)."""
        if not header or not header[:6].lower() == "basic ":
            return False
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return False
        user, _, password = decoded.partition(":")
        ok_user = hmac.compare_digest(user.encode(), self.user.encode())
        ok_password = hmac.compare_digest(password.encode(), self.password.encode())
        return ok_user and ok_password

    def csrf_token(self) -> str:
        """The token actions must echo in ``X-CSRF-Token``: a keyed hash of the credentials."""
        return hmac.new(self.password.encode(), f"celery-ha-web-csrf:{self.user}".encode(),
                        hashlib.sha256).hexdigest()

    def check_csrf(self, header: str | None) -> bool:
        return bool(header) and hmac.compare_digest(str(header).encode(), self.csrf_token().encode())


def basic_header(user: str, password: str) -> str:
    """The ``Authorization`` header value for a client (tests, scripts)."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
