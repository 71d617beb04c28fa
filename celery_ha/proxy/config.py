"""The pool's knobs (rates, lease length, ban backoff), validated once and encoded for the scripts."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from celery_ha.base.errors import InvalidInput
from celery_ha.base.settings import Settings
from celery_ha.base.validation import check_int, check_number, check_seconds, parse_rate
from celery_ha.proxy.validation import normalize_domain

log = logging.getLogger(__name__)


@dataclass
class PoolConfig:
    """Knobs of the pool. Times are seconds. Defaults follow the seed article (5 requests / 60 s).

    These are each worker's defaults; per-domain overrides stored in Redis (``set_domain_rate``,
    ``set_domain_budget``) win over them for every worker at once.
    """

    rate: tuple[int, float] = (5, 60.0)  # per proxy × domain; CELERY_HA_PROXY_RATE
    domain_rates: dict[str, tuple[int, float]] = field(default_factory=dict)  # CELERY_HA_PROXY_DOMAIN_RATES
    domain_budgets: dict[str, tuple[int, float]] = field(default_factory=dict)  # across all proxies
    lock_ttl: float = 30.0  # lease of one borrowed proxy × domain (SET NX PX)
    window_margin: float = 0.0  # extra seconds added to every window (clock/latency slack)
    max_fails: int = 3  # consecutive transport failures before a temporary ban
    ban_base: float = 60.0  # first temporary ban; doubles per ban, jittered ±25 %
    ban_cap: float = 3600.0
    max_temp_bans: int = 5  # the next ban after this many is permanent
    block_ban_base: float = 60.0  # per-domain cool-down after a block (401/403/429/captcha)
    block_ban_cap: float = 3600.0
    # The pool runs without health checks: temporary bans end by time alone and proxies added with
    # verify=True leave the 'new' zone unchecked (both in acquire's housekeeping), instead of after a
    # passed check. None: True when CELERY_HA_PROXY_CHECK_URL is unset, since then no check ever runs
    # and a "temporary" ban would never end, nor would a verified proxy ever be used.
    unban_by_time: bool | None = None

    def __post_init__(self) -> None:
        self.rate = parse_rate(self.rate, "proxy rate")
        self.domain_rates = {
            normalize_domain(d): parse_rate(r, f"rate for {d}") for d, r in dict(self.domain_rates).items()
        }
        self.domain_budgets = {
            normalize_domain(d): parse_rate(r, f"budget for {d}")
            for d, r in dict(self.domain_budgets).items()
        }
        # Finite and bounded: each becomes an integer of milliseconds inside Lua.
        for name in ("lock_ttl", "ban_base", "ban_cap", "block_ban_base", "block_ban_cap"):
            setattr(self, name, check_seconds(name, getattr(self, name), high=30 * 86_400))
        self.window_margin = check_number("window_margin", self.window_margin, 0, 3600, unit="seconds")
        self.max_fails = check_int("max_fails", self.max_fails, 1, 1000)
        self.max_temp_bans = check_int("max_temp_bans", self.max_temp_bans, 0, 1000)
        if self.unban_by_time is None:
            self.unban_by_time = not Settings.one("proxy_check_url")
        elif not isinstance(self.unban_by_time, bool):
            raise InvalidInput(f"unban_by_time must be True, False or None, got {self.unban_by_time!r}")
        self._warned_unchecked = False
        # Built once: release is the hot path and sends this with every call.
        self._release_arg = " ".join(
            str(int(v))
            for v in (
                self.max_fails,
                self.ban_base * 1000,
                self.ban_cap * 1000,
                self.max_temp_bans,
                self.block_ban_base * 1000,
                self.block_ban_cap * 1000,
            )
        )

    @property
    def release_arg(self) -> str:
        """ARGV[10] of ``release.lua``: ``"max_fails ban_base_ms ban_cap_ms max_temp_bans block_base_ms
        block_cap_ms"``, as validated at construction."""
        return self._release_arg

    @property
    def health_ban_arg(self) -> str:
        """ARGV[6] of ``health_result.lua``: ``"ban_base_ms ban_cap_ms max_temp_bans"``."""
        return f"{int(self.ban_base * 1000)} {int(self.ban_cap * 1000)} {self.max_temp_bans}"

    def warn_unchecked(self, added: int) -> None:
        """Say once (per config, so per worker pool) that proxies just added with verify=True will be
        used unchecked: without a check that is the only way they are ever used, and a silent change of
        what verify means would surprise whoever relies on it to keep dead free proxies out."""
        if added and self.unban_by_time and not self._warned_unchecked:
            self._warned_unchecked = True
            log.warning(
                "proxy add: %d proxy(ies) added with verify=True join rotation unchecked at the next acquire:"
                " no health check runs (CELERY_HA_PROXY_CHECK_URL unset, or unban_by_time=True); set"
                " CELERY_HA_PROXY_CHECK_URL to keep new proxies out until a check passes",
                added,
            )

    @classmethod
    def from_env(cls, **overrides: Any) -> PoolConfig:
        """Defaults from the settings: ``CELERY_HA_PROXY_RATE`` and ``CELERY_HA_PROXY_DOMAIN_RATES``
        (``"example.com=2/10,shop.example=10/60"``)."""
        settings = Settings.from_env()
        values: dict[str, Any] = {
            "rate": settings.proxy_rate,
            "domain_rates": dict(settings.proxy_domain_rates),
        }
        values.update(overrides)
        return cls(**values)
