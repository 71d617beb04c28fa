"""The host gate as one fetch of one task uses it: asks fenced by the task's lease, requests marked in flight.

``ctx.fetch`` hands the fetcher a :class:`LeaseGate` for a request to the task's own host. Each ask
(``request``) checks that the task is still the lease's (a woken zombie gets LeaseLost and sends
nothing), and under a concurrency limit marks the request in flight for at most ``in_flight``
seconds (``h:<host>`` field ``f:<id>``, see ``_hosts.lua``). The fetcher reports each answer
(``finished``), which drops the mark. Should the task end with the mark still there, its holder
having died mid-request (a SIGKILLed pool child released by the failover, a process stopped past its
lease and reclaimed), the site may still be answering, so the host's slot stays held until the
mark's time is over. A request let go that never went out (no proxy came, the pool refused) is
reported by :meth:`LeaseGate.settle`, so a hand-back that follows holds nothing.
"""

from __future__ import annotations

from typing import Any, Protocol

from celery_ha.state.records import Lease


class _Gate(Protocol):
    """What of ``celery_ha.state.hosts.HostGate`` a LeaseGate calls (hosts.py imports this module)."""

    def request(self, host: str, lease: Lease | None = None, in_flight: float = 0.0) -> float: ...

    def finished(self, host: str, lease: Lease | None = None) -> None: ...

    def unsent(self, host: str, lease: Lease) -> None: ...

    def fences(self, lease: Lease) -> bool: ...


class LeaseGate:
    """A :class:`~celery_ha.state.hosts.HostGate` bound to one task's lease for one fetch
    (``HostGate.for_lease``)."""

    def __init__(self, gate: _Gate, lease: Lease, in_flight: float = 0.0) -> None:
        self.gate, self.lease, self.in_flight = gate, lease, in_flight
        self._open: str | None = None  # the host of the request let go and not reported over yet

    @property
    def fenced(self) -> bool:
        """Whether its asks check the lease (the task's record is on its host's shard, as a gated
        task's is): else the caller fences the request itself."""
        return self.gate.fences(self.lease)

    def request(self, host: str) -> float:
        wait = self.gate.request(host, self.lease, self.in_flight)
        if wait <= 0:
            self._open = host
        return wait

    def finished(self, host: str) -> None:
        self.gate.finished(host, self.lease)
        self._open = None

    def settle(self) -> None:
        """The fetch ended without sending the request it was last let go for (the fetcher raised
        before sending it): drop its in-flight mark. Nothing to do when every request was reported."""
        if self._open is not None:
            host, self._open = self._open, None
            self.gate.unsent(host, self.lease)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.gate, name)  # the other reports (defer, block_until_retry, ...) as they are
