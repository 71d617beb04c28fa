"""The HTTP side of ``celery-ha web``: the standard library's threading server, no framework.

Routes: ``/metrics`` (Prometheus text, or OpenMetrics when asked), ``/`` and ``/static/*`` (the
dashboard; every asset ships in the package, nothing is fetched from the internet), ``/api/stats``,
``/api/dashboard``, ``/api/session``, ``/healthz``; POST ``/api/dead/redrive`` and
``/api/proxies/unban`` only when the server has credentials. A server of several namespaces puts all
of them in one ``/metrics`` (the namespace label tells them apart); every other route takes
``?namespace=NAME`` (default: the first served).

Every request reads Redis afresh, so the process keeps no state and any number can run side by side.
With credentials every route needs them. Bound to a loopback address, the server answers only
requests whose ``Host`` is a loopback name, so a web page cannot reach it through DNS rebinding.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from celery_ha.base.masking import mask_url
from celery_ha.monitoring.actions import ACTIONS, ActionError, parse_body
from celery_ha.monitoring.auth import BasicAuth
from celery_ha.monitoring.collector import Source, StateCollector
from celery_ha.monitoring.dashboard import Reader, dashboard, stats_snapshot

log = logging.getLogger(__name__)

STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "app.css": "text/css; charset=utf-8", "favicon.svg": "image/svg+xml"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
                               "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class WebApp:
    """What every request needs: the readers (one per namespace served, the first the default), the
    metrics registry (every namespace in one scrape), the credentials.

    ``grow`` (a server of namespace patterns) is asked, at most every ``grow_every`` seconds and at a
    request, for the readers and sources of namespaces it did not serve yet (given the served ones):
    a crawl that starts while the server runs appears in /metrics and the dashboard."""

    def __init__(self, readers: Reader | Sequence[Reader], sources: Source | Sequence[Source],
                 auth: BasicAuth | None, host: str,
                 grow: Callable[[set[str]], list[tuple[Reader, Source]]] | None = None,
                 grow_every: float = 10.0) -> None:
        listed = [readers] if isinstance(readers, Reader) else list(readers)
        self.readers = {reader.namespace: reader for reader in listed}
        self.auth = auth
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = StateCollector(sources)
        self.registry.register(self.collector)
        self.loopback_only = is_loopback(host)
        self._grow = grow
        self._grow_every = grow_every
        self._grown_at = float("-inf")
        self._grow_lock = threading.Lock()

    def refresh(self) -> None:
        """Serve the namespaces ``grow`` finds (rate-limited; a failed look is logged and retried)."""
        if self._grow is None or time.monotonic() - self._grown_at < self._grow_every:
            return
        with self._grow_lock:
            if time.monotonic() - self._grown_at < self._grow_every:
                return
            self._grown_at = time.monotonic()
            try:
                added = self._grow(set(self.readers))
            except redis.RedisError as exc:
                log.warning("could not look for new namespaces: %s", mask_url(str(exc)))
                return
            if added:  # copies, swapped in whole: other request threads iterate them meanwhile
                self.readers = {**self.readers, **{reader.namespace: reader for reader, _ in added}}
                self.collector.sources = [*self.collector.sources, *(source for _, source in added)]

    @property
    def reader(self) -> Reader:
        """The default namespace's reader (the first served)."""
        return next(iter(self.readers.values()))

    def served(self) -> dict[str, list[str]]:
        """``{"namespaces": [...]}`` for a server of several namespaces (documents of one stay as
        they were)."""
        return {"namespaces": list(self.readers)} if len(self.readers) > 1 else {}

    def reader_for(self, query: str) -> Reader | None:
        """The reader a request's ``?namespace=`` names (the default without one); None: not served."""
        self.refresh()
        names = parse_qs(query).get("namespace")
        return self.reader if not names else self.readers.get(names[-1])

    def static(self, name: str) -> bytes:
        return (resources.files("celery_ha.monitoring") / "static" / name).read_bytes()


class Handler(BaseHTTPRequestHandler):
    server_version = "celery-ha-web"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    @property
    def app(self) -> WebApp:
        return self.server.app  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), mask_url(format % args))

    # ------------------------------------------------------------------ responses
    def _send(self, status: int, body: bytes, content_type: str,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {**SECURITY_HEADERS, **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, doc: Any) -> None:
        self._send(status, json.dumps(doc, separators=(",", ":")).encode(), "application/json",
                   {"Cache-Control": "no-store"})

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": mask_url(message)})

    # ------------------------------------------------------------------ checks
    def _host_ok(self) -> bool:
        if not self.app.loopback_only:
            return True
        host = urlsplit("//" + (self.headers.get("Host") or "")).hostname or ""
        return is_loopback(host)

    def _authorized(self) -> bool:
        auth = self.app.auth
        if auth is None or auth.check(self.headers.get("Authorization")):
            return True
        self._send(401, b'{"error":"authentication required"}', "application/json",
                   {"WWW-Authenticate": 'Basic realm="celery-ha", charset="UTF-8"'})
        return False

    def _same_origin(self) -> bool:
        origin = self.headers.get("Origin")
        return origin is None or urlsplit(origin).netloc == (self.headers.get("Host") or "")

    # ------------------------------------------------------------------ routing
    def do_GET(self) -> None:
        if not self._host_ok():
            return self._error(421, "this server answers loopback host names only")
        if not self._authorized():
            return None
        url = urlsplit(self.path)
        path = url.path
        reader = self.app.reader_for(url.query)
        if reader is None:
            return self._error(404, "this server does not serve that namespace (see /healthz)")
        try:
            if path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                return self._send(200, encoder(self.app.registry), content_type,
                                  {"Cache-Control": "no-store"})
            if path == "/healthz":
                reader.client.ping()
                return self._json(200, {"ok": True, "namespace": reader.namespace, **self.app.served()})
            if path == "/api/stats":
                return self._json(200, stats_snapshot(reader))
            if path == "/api/dashboard":
                return self._json(200, dashboard(reader))
            if path == "/api/session":
                auth = self.app.auth
                return self._json(200, {"actions": auth is not None, "user": auth.user if auth else None,
                                        "csrf": auth.csrf_token() if auth else None, **self.app.served()})
            name = "index.html" if path == "/" else path.removeprefix("/static/")
            if name in STATIC and (path == "/" or path.startswith("/static/")):
                return self._send(200, self.app.static(name), STATIC[name], {"Cache-Control": "no-cache"})
            return self._error(404, "not found")
        except redis.RedisError as exc:
            return self._error(503, f"Redis unavailable: {exc}")
        except Exception:
            log.exception("request %s failed", mask_url(path))
            return self._error(500, "internal error (see the server's log)")

    do_HEAD = do_GET

    def do_POST(self) -> None:
        if not self._host_ok():
            return self._error(421, "this server answers loopback host names only")
        if not self._authorized():
            return None
        url = urlsplit(self.path)
        path = url.path
        action = ACTIONS.get(path)
        reader = self.app.reader_for(url.query)
        if action is None or reader is None:
            return self._error(404, "not found" if action is None else
                               "this server does not serve that namespace (see /healthz)")
        auth = self.app.auth
        if auth is None:
            return self._error(403, "actions need credentials: start celery-ha web with --auth USER:PASSWORD")
        if not self._same_origin() or not auth.check_csrf(self.headers.get("X-CSRF-Token")):
            return self._error(403, "missing or wrong X-CSRF-Token (send the token of /api/session)")
        if (self.headers.get("Content-Type") or "").split(";")[0].strip() != "application/json":
            return self._error(415, "Content-Type must be application/json")
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length < 0:
                raise ValueError(length)
            body = parse_body(self.rfile.read(min(length, 1 << 16)))
            return self._json(200, action(reader, body))
        except ValueError:
            return self._error(400, "bad Content-Length")
        except ActionError as exc:
            return self._error(exc.status, str(exc))
        except redis.RedisError as exc:
            return self._error(503, f"Redis unavailable: {exc}")


class WebServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, app: WebApp, host: str, port: int) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.app = app
        super().__init__((host.strip("[]"), port), Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        return f"http://{shown}:{port}"
