"""The fetcher's side of the host gate: what it tells the gate, and how a request waits for its host.

The gate spaces hand-outs of a host's tasks from their claims, but a task may reach its request late
(a slow robots.txt first, a retry after a 5xx, its second or third page) and meet a request of another
task, sent on time by another worker. So every request of a task on its own host asks the gate first
(``HostPacer.request``, one atomic script on the Redis clock): it goes when the host's spacing has
passed since the last request's start or answer and the host is not blocked, else it waits. The
wait is short when the hand-outs are paced (the few ms to a second one task's delay shifted it), so
the fetch sleeps it out holding its task's slot; a longer one (a block, a long Crawl-delay still to
run) hands the task back uncounted (HostNotReady), and the gate hands it out again in its turn. The
request asks before it borrows a proxy, so no lease runs down while it waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from celery_ha.fetch.errors import HostNotReady

#: Seconds a request sleeps at most for its host's spacing inside its task; a longer wait hands the
#: task back (its slot goes to another host meanwhile).
MAX_REQUEST_WAIT = 10.0
#: Turns of asking, sleeping and asking again before the task is handed back: each turn lost went to
#: another request of the host, and there are at most as many as the host has tasks running.
MAX_REQUEST_TURNS = 20
#: Seconds added to a request's in-flight bound for the moments between the gate's stamp and the
#: request leaving (a process descheduled in between): the bound errs long.
IN_FLIGHT_SLACK = 1.0
#: What a timeout of None (wait for ever) counts as in an in-flight bound.
UNBOUNDED_WAIT = 600.0


class HostPacer(Protocol):
    """What the fetcher tells the durable state layer's host gate (``celery_ha.state.hosts.HostGate``
    is one): the host's pacing, fleet-wide. Passed per call (``fetch(..., gate=...)``) by a task whose
    own host is the one fetched."""

    def defer(self, host: str, seconds: float) -> None: ...

    def request(self, host: str) -> float: ...

    def finished(self, host: str) -> None: ...

    def block_until_retry(self, host: str, seconds: float, reason: str) -> float | None: ...

    def backoff(self, host: str, reason: str) -> float | None: ...

    def set_crawl_delay(self, host: str, seconds: float | None, cap: float = 30.0) -> float: ...


def answer_wait(timeout: float | tuple[float | None, float | None] | None) -> float:
    """The longest a request under requests' ``timeout`` waits for its answer's head: connect + read."""
    connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
    return sum(UNBOUNDED_WAIT if t is None else float(t) for t in (connect, read))


def in_flight_bound(timeouts: list[Any], borrow_wait: float = 0.0, proxy_lease: float = 0.0) -> float:
    """Seconds from the gate's stamp after which a request the fetcher sends is over as far as its
    client waits: what the gate keeps a host's slot held for when the task's holder dies with the
    request unreported (the site may still be answering it; it cannot know the client is gone).

    ``timeouts``: the request timeouts the fetch may use (requests' form; the longest counts);
    ``borrow_wait``: how long the fetcher may wait for a proxy between the stamp and the send (its
    ``max_wait`` with a pool); ``proxy_lease``: a proxied request is cut, body included, within its
    proxy lease (``lock_ttl``). A direct fetch's body is read under per-read timeouts only: a site
    that trickles one may still be sending it past the bound."""
    longest = max((answer_wait(t) for t in timeouts), default=0.0)
    return borrow_wait + max(longest, proxy_lease) + IN_FLIGHT_SLACK


def wait_for_turn(gate: HostPacer, host: str, deadline: float, sleep: Callable[[float], None]) -> None:
    """Return once the gate lets a request to ``host`` go now (stamped as its start); sleep out a
    short wait, raise HostNotReady for a long one, or past ``deadline`` (``time.monotonic``)."""
    for _ in range(MAX_REQUEST_TURNS):
        wait = gate.request(host)
        if wait <= 0:
            return
        if wait > MAX_REQUEST_WAIT or time.monotonic() + wait > deadline:
            break
        sleep(wait)
    raise HostNotReady(f"{host} may not be sent a request now; its task goes back to the gate", host=host,
                       retry_after=max(0.0, wait))


def host_busy(gate: HostPacer, host: str, status: int, retry_after: float) -> None:
    """A 429/503 from the task's own host: block the host for the whole fleet (until Retry-After,
    else with the gate's doubling backoff) and hand the task back (HostNotReady)."""
    if retry_after > 0:
        until = gate.block_until_retry(host, retry_after, f"HTTP {status} with Retry-After")
    else:
        until = gate.backoff(host, f"HTTP {status}")
    wait = max(0.0, (until or 0.0) - time.time()) if until else retry_after
    raise HostNotReady(f"{host} answered HTTP {status}; held back {wait:.1f}s", host=host, retry_after=wait)
