"""The names the Scrapy integration writes: request meta keys and stats keys, defined once.

Meta values are plain strings, numbers and lists, so a request stays serializable for Scrapy's disk
queues (``JOBDIR``); the lease itself never goes into meta, only its token. Nothing here holds a
credential: a proxy is named by its pool id (``host:port``), never by its URL.
"""

from __future__ import annotations

# ------------------------------------------------------------------ request.meta
#: Set by a spider to keep one request away from the pool (it is sent as Scrapy would send it).
SKIP = "celery_ha_skip"
#: The pool id of the proxy the current download goes through (absent: direct).
PROXY = "celery_ha_proxy"
#: Pool ids this page already failed through; the next acquire excludes them.
TRIED = "celery_ha_tried"
#: Proxy rotations so far (blocked / transport outcomes), counted apart from ``retry_times``.
ROTATIONS = "celery_ha_rotations"
#: Per-request override of ``CELERY_HA_SCRAPY_MAX_ROTATIONS``.
MAX_ROTATIONS = "celery_ha_max_rotations"
#: Wall-clock time (``time.time()``) before which the request must not be sent: the retry backoff.
NOT_BEFORE = "celery_ha_not_before"
#: What the last download through the pool came to (ok, blocked, server, transport, permanent...).
OUTCOME = "celery_ha_outcome"
#: The ``Retry-After`` of the last answer, in seconds (0 = none).
RETRY_AFTER = "celery_ha_retry_after"
#: The token of the lease the current download holds: how a request is matched to its lease.
LEASE = "_celery_ha_lease"
#: The request's ``download_timeout`` before the middleware fitted it to a lease (None = none).
OWN_TIMEOUT = "_celery_ha_timeout"
#: Scrapy's own keys this integration reads or writes.
RETRY_TIMES = "retry_times"
DOWNLOAD_SLOT = "download_slot"
DOWNLOAD_TIMEOUT = "download_timeout"
DOWNLOAD_LATENCY = "download_latency"
#: Prefix of the download slots the middleware assigns (one per proxy × domain, like the pool's lock).
SLOT_PREFIX = "celery-ha "

# ------------------------------------------------------------------ stats collector
ACQUIRED = "celery_ha/proxy/acquired"
RELEASED = "celery_ha/proxy/released/"  # + outcome
ROTATED = "celery_ha/proxy/rotations"
DIRECT = "celery_ha/proxy/direct"
WAITS = "celery_ha/proxy/waits"
WAIT_SECONDS = "celery_ha/proxy/wait_seconds"
GAVE_UP_WAITING = "celery_ha/proxy/gave_up_waiting"
SWEPT = "celery_ha/proxy/swept"
#: Leases (nearly) run out while their request waited in its download slot: given back, borrowed again.
EXPIRED_IN_SLOT = "celery_ha/proxy/expired_in_slot"
RELEASE_REPLY = "celery_ha/proxy/release_reply/"  # + 'late' / 'stale' (anything but 'ok')
RELEASE_FAILED = "celery_ha/proxy/release_failed"
REDIS_ERRORS = "celery_ha/proxy/redis_errors"
RETRIES = "celery_ha/retry/count"
RETRY_REASON = "celery_ha/retry/reason_count/"  # + outcome
GAVE_UP = "celery_ha/retry/gave_up"
