"""What every command shares: the settings, the Redis URL and lazily built clients.

Nothing connects until a command needs it, so ``--help`` and input validation work without Redis,
and a bad environment variable only fails the commands that read it (with one clear line).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import click
import redis

from celery_ha.base.errors import InvalidInput
from celery_ha.base.settings import Settings
from celery_ha.base.validation import NAMESPACE_RULE, check_namespace
from celery_ha.redisio.client import redis_client
from celery_ha.runtime.resolve import resolve_redis_url

if TYPE_CHECKING:
    from celery_ha.proxy import ProxyPool
    from celery_ha.state import TaskQueue

def check_namespace_option(_ctx: click.Context | None, _param: Any, value: str | None) -> str | None:
    """click callback: the same rule as ``CELERY_HA_NAMESPACE`` (``celery_ha.base.validation``)."""
    if value is not None:
        try:
            check_namespace(value)
        except InvalidInput:
            raise click.BadParameter(f"must be {NAMESPACE_RULE}") from None
    return value


@dataclass
class CLIContext:
    """Per-invocation state, stored as ``ctx.obj``."""

    redis_url_option: str | None = None
    namespace_option: str | None = None
    #: Whether this command may start the embedded Redis when no URL is configured: ``demo``, ``up``
    #: and ``redis start`` may; every other command attaches to a running one or stops with one line
    #: (``CELERY_HA_EMBEDDED=1`` lets any of them start it).
    start_embedded: bool = False
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
        """The state-layer URL: the option, ``CELERY_HA_REDIS_URL``, else the embedded Redis (attached to
        when it runs; started when this command may, see :attr:`start_embedded`)."""
        if self._url is None:
            start = self.start_embedded or self.settings.embedded
            self._url = self.redis_url_option or resolve_redis_url(self.settings, start=start, attach=True)
        return self._url

    @cached_property
    def client(self) -> redis.Redis:
        client = redis_client(self.redis_url, socket_connect_timeout=5, socket_timeout=30)
        client.ping()  # fail here, with the URL in the message, rather than deep inside a command
        return client

    @cached_property
    def queue(self) -> TaskQueue:
        from celery_ha.state import TaskQueue

        return TaskQueue.for_settings(self.client, self.settings, self.namespace)

    @cached_property
    def pool(self) -> ProxyPool:
        from celery_ha.proxy import ProxyPool

        return ProxyPool(self.client, self.namespace)


pass_cli = click.make_pass_decorator(CLIContext)
