"""Read a response body by a wall-clock deadline: a fetch through a proxy never outlives its lease.

Why: requests' read timeout bounds each socket read, not the body. A site (or a proxy) that sends a
byte every few seconds keeps a download going for as long as it likes, each read inside the timeout,
while the proxy × domain lock the fetch borrowed expires and another worker is handed the same proxy
for the same site: two requests at once where the pool promises one. So the body is read with a
timer armed for the lease's end, which shuts the connection's socket down if the body is not in by
then (a blocked read then returns at once); the fetch reports a timeout, as for a silent site.

The socket is reached through the response's ``fileno()`` (public in urllib3 1.26 and 2.x, verified
on 2.8, and in http.client). A response without one (another adapter) is read without the cut, once
logged.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import requests

log = logging.getLogger(__name__)
_warned = threading.Event()


class BodyTooSlow(requests.exceptions.ReadTimeout):
    """The body did not arrive by the deadline (the proxy lease's end): a timeout, for the pool."""


def within(timeout: float | tuple[float | None, float | None] | None, budget: float) -> tuple[float, float]:
    """requests' ``(connect, read)`` timeouts from a caller's ``timeout``, cut so that the connect and
    the answer's head fit ``budget`` seconds together (each at least half of it)."""
    connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
    connect = budget / 2 if connect is None else min(float(connect), budget / 2)
    return connect, min(budget if read is None else float(read), max(budget - connect, budget / 2))


def _socket_of(response: requests.Response) -> socket.socket | None:
    """A duplicate of the response's socket (``fileno()``, public in urllib3 and http.client): it
    reaches the connection even once http.client has handed the socket to the response (an answer
    that closes its connection), and stays valid if the original is closed and its number reused.
    None when no connection is open (the body is in already) or the response has no ``fileno``."""
    raw = response.raw
    if not hasattr(raw, "fileno"):
        if not _warned.is_set():
            _warned.set()
            log.warning("celery-ha: this HTTP adapter's responses give no socket; a proxied body is "
                        "read without a cut at the proxy lease's end")
        return None
    try:
        return socket.socket(fileno=os.dup(raw.fileno()))
    except (OSError, ValueError):
        return None


def _cut(sock: socket.socket, fired: threading.Event) -> None:
    fired.set()
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed: the read has ended anyway


def read_body_by(response: requests.Response, deadline: float) -> None:
    """Read ``response``'s body (a ``stream=True`` response) into it by ``deadline`` (``time.monotonic``);
    raises :class:`BodyTooSlow`, with the connection closed, when it is not in by then. A body that
    arrived whole as the timer fired is kept: the request was over before the lease was."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:  # the answer's head came too late: no time left for any body
        response.close()
        raise BodyTooSlow("the answer came too late for the proxy lease")
    sock = _socket_of(response)
    fired = threading.Event()
    timer = None
    if sock is not None:
        timer = threading.Timer(remaining, _cut, (sock, fired))
        timer.daemon = True
        timer.start()
    try:
        response.content  # noqa: B018 -- reads and keeps the body
    except Exception:  # the cut surfaces as whatever the layers make of a dead socket
        if not fired.is_set():
            raise
        response.close()
        raise BodyTooSlow("the body did not arrive within the proxy lease") from None
    finally:
        if timer is not None:
            timer.cancel()
            timer.join()  # the cut, if it is under way, is over before its socket goes
        if sock is not None:
            sock.close()  # the duplicate only: the connection stays
