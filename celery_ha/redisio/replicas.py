"""Wait for replicas after a transition: the operator's bound on what a failover can lose.

Redis replication is asynchronous: a master that dies can take its last writes with it, and the
replica Sentinel promotes never saw them. With ``CELERY_HA_MIN_REPLICAS=N`` every state transition
is followed by ``WAIT N timeout`` on the same connection, sent in the same write as the script (no
extra round trip; the reply comes once N replicas hold the transition, or at the timeout). A WAIT
that times out does not undo or fail the transition (Redis cannot take it back): it is logged, so an
operator sees that the bound did not hold for a while.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

#: At most one "replicas are behind" line per this many seconds and process.
LOG_EVERY = 10.0


@dataclass
class ReplicaWait:
    """``WAIT replicas timeout_ms`` after each script call of one :class:`ScriptSet`."""

    replicas: int
    timeout_ms: int
    short: int = 0  # WAITs that returned fewer replicas than asked, this process
    _logged_at: float = field(default=float("-inf"), repr=False)

    @property
    def command(self) -> tuple[str, int, int]:
        return ("WAIT", self.replicas, self.timeout_ms)

    def check(self, acknowledged: object) -> None:
        """Account for one WAIT reply (the number of replicas that hold the write)."""
        count = int(acknowledged) if isinstance(acknowledged, int) else 0
        if count >= self.replicas:
            return
        self.short += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY:
            self._logged_at = now
            log.warning("only %d of %d replica(s) acknowledged a transition within %d ms (%d such so far): "
                        "a failover now could lose it", count, self.replicas, self.timeout_ms, self.short)


def replica_wait(replicas: int, timeout: float) -> ReplicaWait | None:
    """The wait for ``replicas`` (None when 0: no waiting at all)."""
    return ReplicaWait(replicas, max(1, int(timeout * 1000))) if replicas > 0 else None
