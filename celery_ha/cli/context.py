"""What every command shares: the settings, the Redis URL and lazily built clients.

Nothing connects until a command needs it, so ``--help`` and input validation work without Redis,
and a bad environment variable only fails the commands that read it (with one clear line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import click
import redis

from celery_ha.base.settings import Settings
from celery_ha.redisio.client import redis_client
from celery_ha.runtime.resolve import resolve_redis_url

if TYPE_CHECKING:
    from celery_ha.proxy import ProxyPool
    from celery_ha.state import TaskQueue

_NAMESPACE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def check_namespace(_ctx: click.Context | None, _param: Any, value: str | None) -> str | None:
    """click callback: the same rule as ``CELERY_HA_NAMESPACE``."""
    if value is not None and not _NAMESPACE.match(value):
        raise click.BadParameter("must be 1-64 characters of letters, digits, '_', '.', '-'")
    return value


@dataclass
class CLIContext:
    """Per-invocation state, stored as ``ctx.obj``."""

    redis_url_option: str | None = None
    namespace_option: str | None = None
    _url: str | None = field(default=None, init=False)

    @cached_property
    def settings(self) -> Settings:
        return Settings.from_env()

    @property
    def namespace(self) -> str:
        return self.namespace_option or self.settings.namespace

    @property
    def external(self) -> bool:
        """True when the user named a Redis (option or env); False means the embedded one."""
        return bool(self.redis_url_option or self.settings.redis_url)

    @property
    def known_url(self) -> str | None:
        """The URL if already resolved (for error messages; never starts anything)."""
        return self._url or self.redis_url_option

    @property
    def redis_url(self) -> str:
        """The state-layer URL; starts the embedded Redis on first use when none is configured."""
        if self._url is None:
            self._url = self.redis_url_option or resolve_redis_url(self.settings)
        return self._url

    @cached_property
    def client(self) -> redis.Redis:
        client = redis_client(self.redis_url, socket_connect_timeout=5, socket_timeout=30)
        client.ping()  # fail here, with the URL in the message, rather than deep inside a command
        return client

    @cached_property
    def queue(self) -> TaskQueue:
        from celery_ha.state import TaskQueue

        s = self.settings
        return TaskQueue(self.client, self.namespace, lease_ttl=s.lease_ttl, max_attempts=s.max_attempts,
                         max_stalls=s.max_stalls)

    @cached_property
    def pool(self) -> ProxyPool:
        from celery_ha.proxy import ProxyPool

        return ProxyPool(self.client, self.namespace)


pass_cli = click.make_pass_decorator(CLIContext)
