"""The dashboard's two actions: redrive a dead letter (or all of them) and unban a proxy.

Each takes a small JSON body, validates it with the layers' own checks and answers a JSON result.
The server only routes here after basic auth and the CSRF token passed (``server.py``).
"""

from __future__ import annotations

import json
from typing import Any

from celery_ha.base.errors import CeleryHAError, InvalidInput, TaskNotFound
from celery_ha.base.masking import mask_url
from celery_ha.monitoring.dashboard import Reader

MAX_BODY = 4096


class ActionError(Exception):
    """A refused action: the HTTP status and a one-line, masked reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_body(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_BODY:
        raise ActionError(413, f"body larger than {MAX_BODY} bytes")
    try:
        body = json.loads(raw.decode("utf-8") or "{}")
    except (UnicodeDecodeError, ValueError, RecursionError):
        # RecursionError: a few KB of '[' nest deeper than the parser recurses. A bad body, not a
        # server failure.
        raise ActionError(400, "body must be a JSON object") from None
    if not isinstance(body, dict):
        raise ActionError(400, "body must be a JSON object")
    return body


def _text(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise ActionError(400, f"{name!r} must be a non-empty string")
    return value


def redrive(reader: Reader, body: dict[str, Any]) -> dict[str, Any]:
    """``{"id": ID}`` redrives one dead task, ``{"all": true}`` every one; answers how many moved."""
    try:
        if body.get("all") is True:
            return {"redriven": reader.queue.redrive()}
        return {"redriven": reader.queue.redrive(_text(body, "id"))}
    except CeleryHAError as exc:
        raise ActionError(404 if isinstance(exc, TaskNotFound) else 400, mask_url(str(exc))) from None


def unban(reader: Reader, body: dict[str, Any]) -> dict[str, Any]:
    """``{"id": PROXY_ID}``: back in rotation with clean failure counts; answers its score."""
    try:
        return {"unbanned": _text(body, "id"), "score": reader.pool.unban(_text(body, "id"))}
    except InvalidInput as exc:
        raise ActionError(404 if "unknown proxy" in str(exc) else 400, mask_url(str(exc))) from None


ACTIONS = {"/api/dead/redrive": redrive, "/api/proxies/unban": unban}
