"""The proxy score, in Python: the reference the Lua scripts (``_common.lua``) must agree with.

``score = 0.6 × success rate + 0.3 × latency score + 0.1 × remaining-lifetime score``

* **Success rate** is a smoothed, decayed ratio: every result multiplies the old counts by ``DECAY``
  (recent results matter more), and ``PRIOR_WEIGHT`` pseudo-results at ``PRIOR_SUCCESS`` are added. A new
  proxy therefore starts at 0.5 (probation) and one result moves it by less than 0.1.
* **Latency score** is ``LATENCY_REF / (LATENCY_REF + latency)`` on a decayed latency average that also
  carries a prior of ``LATENCY_PRIOR_WEIGHT`` samples at ``LATENCY_REF`` ms: 120 ms → ~0.89, 1 s → 0.5.
* **Remaining lifetime** is the fraction of the proxy's lease with its provider still left (1.0 for
  proxies without an expiry, such as a static list).

The Lua copy reads these constants from :data:`LUA_CONSTANTS` (passed in ARGV as :data:`SCORE_ARG`), so
there is one source.
"""

from __future__ import annotations

W_SUCCESS, W_LATENCY, W_LIFETIME = 0.6, 0.3, 0.1
DECAY = 0.95
PRIOR_SUCCESS = 0.5
PRIOR_WEIGHT = 5.0
LATENCY_REF = 1000.0  # ms
LATENCY_PRIOR_WEIGHT = 2.0


def success_rate(s: float, t: float) -> float:
    """Smoothed success rate from decayed successes ``s`` out of decayed results ``t``."""
    return (s + PRIOR_WEIGHT * PRIOR_SUCCESS) / (t + PRIOR_WEIGHT)


def latency_score(lat_sum: float, lat_n: float) -> float:
    """Latency score from the decayed latency sum and sample count (prior included)."""
    lat = (lat_sum + LATENCY_PRIOR_WEIGHT * LATENCY_REF) / (lat_n + LATENCY_PRIOR_WEIGHT)
    return LATENCY_REF / (LATENCY_REF + lat)


def lifetime_score(now_ms: float, added_ms: float, expires_ms: float) -> float:
    """Fraction of the provider lease left; 1.0 when the proxy does not expire."""
    if expires_ms <= 0:
        return 1.0
    span = max(1.0, expires_ms - added_ms)
    return min(1.0, max(0.0, (expires_ms - now_ms) / span))


def score(s: float, t: float, lat_sum: float, lat_n: float, lifetime: float) -> float:
    """The weighted score stored as the proxy's rank in the available zone."""
    return W_SUCCESS * success_rate(s, t) + W_LATENCY * latency_score(lat_sum, lat_n) + W_LIFETIME * lifetime


def fold(
    s: float, t: float, lat_sum: float, lat_n: float, *, success: bool | None, latency_ms: float | None
) -> tuple[float, float, float, float]:
    """Apply one result the way ``release.lua`` does (``success=None`` leaves the success rate alone)."""
    if success is not None:
        s, t = s * DECAY + (1.0 if success else 0.0), t * DECAY + 1.0
    if latency_ms is not None and latency_ms >= 0:
        lat_sum, lat_n = lat_sum * DECAY + latency_ms, lat_n * DECAY + 1.0
    return s, t, lat_sum, lat_n


LUA_CONSTANTS = (
    W_SUCCESS,
    W_LATENCY,
    W_LIFETIME,
    DECAY,
    PRIOR_SUCCESS,
    PRIOR_WEIGHT,
    LATENCY_REF,
    LATENCY_PRIOR_WEIGHT,
)

#: :data:`LUA_CONSTANTS` as the one ARGV string every scoring script reads (order as listed above).
SCORE_ARG = " ".join(repr(float(c)) for c in LUA_CONSTANTS)
