"""Is the namespace a command acts on one that exists? A mistyped ``-n shpo pause`` must not report
success (and create ``cha:{shpo}:meta``) while the real namespace ``shop`` keeps dispatching.

A namespace is known when the registry holds it (``state/namespaces.py``: filled at its first
enqueue) or when it holds one of the keys any use of it leaves: its meta or stats hash (namespaces
written by releases before the registry, or migrated into), a worker's registration (served by
name before anything was enqueued), host gate or schedule settings, or a proxy pool (both may be
set up before the first enqueue, with ``--force``). One round trip (``SISMEMBER`` + one ``EXISTS``
of keys in the namespace's own slot); the registry's names are read only to word a refusal.

Writing verbs refuse an unknown namespace (exit 1, one line naming it and the known ones) unless
``--force``; reading verbs warn on stderr and go on (an empty answer is then no surprise).
``enqueue`` and ``proxies add``/``import`` create namespaces, and ``migrate``'s target is new by
design: they are not checked.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any, TypeVar

import click
import redis

from celery_ha.cli.context import CLIContext
from celery_ha.cli.errors import EXIT_FAILURE
from celery_ha.proxy.keys import ProxyKeys
from celery_ha.state.keys import QueueKeys
from celery_ha.state.namespaces import REGISTRY_KEY, registered

F = TypeVar("F", bound=Callable[..., Any])

#: Most registered names a refusal lists (a Redis may hold thousands of crawls).
NAMES_SHOWN = 10

FORCE_HELP = ("Write even if the namespace is not registered and holds nothing (e.g. host limits or a "
              "pause set up before its first enqueue).")


def force_option(f: F) -> F:
    """``--force``: the escape hatch of :func:`require_known`."""
    return click.option("--force", is_flag=True, help=FORCE_HELP)(f)


def _marks(namespace: str) -> list[str]:
    """Keys that exist once a namespace was used in any way (all under its own hash tag: one slot)."""
    keys = QueueKeys(namespace)
    return [keys.meta, keys.stats, keys.workers, keys.task_names, keys.host_config, keys.schedules,
            ProxyKeys(namespace).all]


def is_known(client: redis.Redis, namespace: str) -> bool:
    """True when ``namespace`` is registered or holds one of its marks (one round trip)."""
    pipe = client.pipeline(transaction=False)
    pipe.sismember(REGISTRY_KEY, namespace)
    pipe.exists(*_marks(namespace))
    member, held = pipe.execute()
    return bool(member) or bool(held)


def describe_unknown(client: redis.Redis, namespace: str) -> str:
    """``namespace 'shpo' is not registered and holds nothing (did you mean 'shop'? registered:
    shop, …)``: one line, for a refusal or a warning."""
    names = registered(client)
    close = difflib.get_close_matches(namespace, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    if names:
        shown = ", ".join(names[:NAMES_SHOWN]) + (f" and {len(names) - NAMES_SHOWN} more"
                                                   if len(names) > NAMES_SHOWN else "")
        known = f"registered: {shown}"
    else:
        known = "no namespace is registered; `celery-ha namespaces --scan` finds older ones"
    return f"namespace {namespace!r} is not registered and holds nothing ({hint}{known})"


def require_known(obj: CLIContext, force: bool = False) -> None:
    """Refuse to write to an unknown namespace (a typo): exit 1 with one line, unless ``force``."""
    if force or is_known(obj.client, obj.namespace):
        return
    error = click.ClickException(f"{describe_unknown(obj.client, obj.namespace)}; check -n / "
                                 "CELERY_HA_NAMESPACE, or pass --force to write to it anyway")
    error.exit_code = EXIT_FAILURE
    raise error


def warn_unknown(obj: CLIContext) -> None:
    """Before a read: one warning line on stderr when the namespace is unknown (the read goes on)."""
    if not is_known(obj.client, obj.namespace):
        click.echo(f"Warning: {describe_unknown(obj.client, obj.namespace)}", err=True)
