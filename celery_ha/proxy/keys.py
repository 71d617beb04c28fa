"""Redis key names of the proxy pool.

Every key lives under ``cha:{namespace}:px:`` (the namespace's common prefix, so one hash tag and one
Redis Cluster slot). The Python side names the keys it reads or routes on here; the scripts build the
same names from the prefix they receive as ARGV[1]. The keys only the scripts touch are:

* ``lk:<id>|<domain>``: string, the lock of one proxy × domain, value = lease token (``SET NX PX``)
* ``rw:<id>|<domain>``: zset, the rate window of one proxy × domain (member = token, score = hit ms)
* ``bud:<domain>``: zset, the budget window of a domain across all proxies
* ``cd:<domain>``: zset, when each proxy's full rate window for the domain reopens (cool-down)
* ``dban:<domain>`` / ``blk:<domain>``: zset / hash, per-domain bans after blocks and their counts
* ``dcfg``: hash, domain -> ``"rate_n rate_ms budget_n budget_ms"`` overrides
* ``exp``: zset, proxies with a provider lifetime, score = expiry ms
* ``grp`` / ``gcap`` / ``sem:<group>``: proxy -> group, group -> cap, the group's lease semaphore
"""

from __future__ import annotations

from celery_ha.state.keys import prefix

#: The zone each stored state lives in, as the CLI and :meth:`ProxyPool.list` name them.
STATES = ("avail", "new", "tban", "pban")


class ProxyKeys:
    """The keys of one namespace's proxy pool that the Python code reads or routes script calls on."""

    def __init__(self, namespace: str) -> None:
        p = prefix(namespace) + "px:"
        self.prefix = p
        self.available = p + "av"  # zset: usable proxies, score = proxy score (every call routes on it)
        self.new = p + "new"  # zset: proxies waiting for a first health check, score = due time (ms)
        self.temp_banned = p + "tb"  # zset: score = unban time (ms)
        self.perm_banned = p + "pb"  # zset: score = ban time (ms)
        self.in_use = p + "iu"  # zset: "<id>|<domain>|<token>", score = lease expiry (ms)
        self.all = p + "all"  # set: every known proxy id, whatever its state
        self.stats = p + "stats"  # hash: counters (acquired, out_<outcome>, reaped, bans, ...)
        self.domains = p + "dom"  # hash: "a:<domain>" leases granted, "n:<domain>" refusals
        self._zones = {
            "avail": self.available,
            "new": self.new,
            "tban": self.temp_banned,
            "pban": self.perm_banned,
        }

    def zone(self, state: str) -> str:
        """The zset holding the proxies in ``state`` (one of :data:`STATES`)."""
        return self._zones[state]

    def meta(self, proxy_id: str) -> str:
        """Hash of one proxy: URL, source, statistics, score and ban state (see ``records.py``)."""
        return f"{self.prefix}m:{proxy_id}"

    def api_fresh(self, provider: str) -> str:
        """Marker of an extraction API's cached result: while it exists, nobody calls the API."""
        return f"{self.prefix}api:{provider}:fresh"

    def api_lock(self, provider: str) -> str:
        """Short lock that lets exactly one worker call an extraction API at a time."""
        return f"{self.prefix}api:{provider}:lock"
