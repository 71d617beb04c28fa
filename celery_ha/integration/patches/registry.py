"""What each patch decided in this process: applied, switched off (and why), or not needed here.

A patch that switches itself off says so once per process, as a WARNING: the feature it gave is
missing (a worker that dies on a late ack, a slower reconnect or failover), which an operator must
see at start-up, not discover in an incident. The worker's start-up line lists every patch's state
(``report.py``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

log = logging.getLogger("celery_ha.patches")

ON, OFF, NOT_NEEDED = "on", "off", "not needed"


@dataclass(frozen=True)
class PatchStatus:
    """One patch's state in this process."""

    name: str
    verified: str  # the releases it was verified on, e.g. "kombu 5.6.0-5.7.0"
    state: str  # ON, OFF or NOT_NEEDED
    why: str = ""  # OFF / NOT_NEEDED: what is missing, what is lost

    def line(self) -> str:
        return self.name if self.state == ON else f"{self.name} {self.state} ({self.why})"


_statuses: dict[str, PatchStatus] = {}
_lock = threading.Lock()


def installed(*libraries: str) -> str:
    """The installed release of each library, e.g. "kombu 5.7.0" (what a warning names)."""
    found = []
    for library in libraries:
        try:
            found.append(f"{library} {version(library)}")
        except PackageNotFoundError:
            found.append(f"{library} (not installed)")
    return ", ".join(found)


def applied(name: str, verified: str) -> None:
    with _lock:
        _statuses[name] = PatchStatus(name, verified, ON)


def not_needed(name: str, verified: str, why: str) -> None:
    """Nothing to patch in this configuration (say, a pool without child processes): no warning."""
    with _lock:
        _statuses[name] = PatchStatus(name, verified, NOT_NEEDED, why)


def switched_off(name: str, verified: str, why: str) -> None:
    """The internal ``name`` patches has changed: the library is left alone, and one WARNING per
    process says so (a second call for the same patch only records)."""
    with _lock:
        before = _statuses.get(name)
        _statuses[name] = PatchStatus(name, verified, OFF, why)
    if before is None or before.state != OFF:
        log.warning("celery-ha patch %s is off: %s (verified on %s)", name, why, verified)


def statuses() -> list[PatchStatus]:
    """Every patch decided in this process so far, in the order they decided."""
    with _lock:
        return list(_statuses.values())
