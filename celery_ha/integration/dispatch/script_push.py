"""Let a completion's script push the refill's Celery messages onto the broker lists itself.

Every completion dispatches the next task, whose Celery message a pool process would then publish:
a few tenths of a millisecond of Celery and kombu CPU and a round trip, once per task, and (with
``acks_late``) on the task's critical path. When the broker is Celery's Redis transport on the
state Redis's server (the default: ``CELERY_BROKER_URL`` unset), ``complete_dispatch.lua`` can
``LPUSH`` that message itself as its last step (``state/_push.lua``). This module tells when it can,
and builds what the script needs (:class:`~celery_ha.state.list_push.ListPush`):

- the message, captured from Celery itself: ``send_task`` of each registered durable task with the
  argument ``@@i@@``, published through kombu's in-memory transport (a virtual channel, the same
  code as the Redis transport's up to the list push) from a thread of its own, its name then marked
  too, and turned into a template by cutting at the markers (every task's must be the same). So the
  headers, properties and body are what this Celery and kombu write for a refill
  (``publisher.publish_ids``), but for the body: kept as JSON text (``body_encoding`` unset, which
  kombu's virtual transport reads as is) instead of base64, which Lua would have to encode;
- the list of each message priority, as kombu names it (priority steps, separator and
  ``global_keyprefix`` from ``broker_transport_options``), and the broker's database.

It cannot when the broker is another server or another transport (RabbitMQ, Sentinel given its own
URL, a Redis named differently, a ``broker_write_url`` elsewhere), when something listens to
``before_task_publish`` or ``after_task_publish`` (tracing hooks expect to see every publish), with
task-sent events, with batches (``CELERY_HA_BATCH``: one message carries several ids), with a
durable task of a queue other than ``crawl`` registered, when the crawl queue is routed through a
named exchange (kombu would deliver through its bindings) or its lists expire, when the durable
tasks do not all publish alike or their messages carry an expiry or ETA, or with
``CELERY_HA_SCRIPT_PUSH=0``. Then, and for whatever the script
leaves (a re-send, a refused command), the Python publish goes on as before
(``integration/dispatch/sender.py``).
A refused push (say, an ACL without ``SELECT``) turns the script push off for the process; a full
Redis (OOM) does not, as it passes.

The capture relies on Celery's ``send_task`` and kombu's virtual channel (``_get``), verified on the
releases ``VERIFIED`` names. Each process decides for itself; the worker's main process decides
first, at start-up, and its line names the dispatch path (``patches/report.py``). When the push is
off because this Celery or kombu writes or reads messages otherwise than expected (not because the
configuration says so), that start-up decision logs one WARNING saying why.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
from bisect import bisect
from typing import Any
from urllib.parse import urlsplit

from celery import signals
from celery.exceptions import SoftTimeLimitExceeded
from kombu import Connection, Producer
from kombu.transport.redis import PRIORITY_STEPS
from redis.connection import parse_url

from celery_ha.base.per_process import PerProcess
from celery_ha.integration.core.queues import CRAWL, broker_queue
from celery_ha.integration.core.services import Services
from celery_ha.integration.core.task_spec import REGISTRY
from celery_ha.integration.dispatch.broker import broker_lists, kombu_broker
from celery_ha.redisio.sentinel import is_sentinel_url
from celery_ha.state.list_push import PRIORITIES, ListPush

log = logging.getLogger(__name__)

#: Markers of the captured message, and the template code each becomes.
MARKERS = {"@@i@@": "i", "@@n@@": "n", '"@@p@@"': "p", "@@x@@": "x"}
_MARKER = re.compile("|".join(re.escape(m) for m in MARKERS))

#: Seconds a capture may take (it publishes to kombu's in-memory transport: milliseconds).
CAPTURE_TIMEOUT = 10.0

#: The releases the capture was verified on (pyproject.toml's ceilings stop below the next minor).
VERIFIED = "celery 5.6.3-5.7.0, kombu 5.6.0-5.7.0"


class UnknownMessage(Exception):
    """The message this Celery and kombu write is not one the script can be given a template of."""


def _server(url: str) -> tuple[tuple[Any, ...], int] | None:
    """(what names the server: scheme, host, port, user, password, or the socket path; the database)
    of a redis://, rediss:// or unix:// URL (as redis-py reads it), else None."""
    scheme = urlsplit(url).scheme
    if scheme not in ("redis", "rediss", "unix"):
        return None
    try:
        parts = parse_url(url)
    except ValueError:
        return None
    where = (scheme, parts.get("path") or parts.get("host") or "localhost", parts.get("port") or 6379,
             parts.get("username"), parts.get("password"))
    return where, int(parts.get("db") or 0)


def broker_db(broker_url: str, state_url: str) -> tuple[bool, int | None]:
    """(whether a redis://, rediss:// or unix:// broker lives on the state Redis's server, its
    database there: None for the state's own). Any other URL: (False, None)."""
    broker, state = _server(broker_url), _server(state_url)
    if broker is None or state is None or broker[0] != state[0]:
        return False, None
    return True, None if broker[1] == state[1] else broker[1]


def list_keys(queue: str, transport_options: dict[str, Any]) -> tuple[str, ...]:
    """The Redis list kombu pushes a message of each priority 0..9 onto, for ``queue``: the list of
    the priority step at or below it (``_q_for_pri``)."""
    steps = transport_options.get("priority_steps", PRIORITY_STEPS)
    by_step = dict(zip(steps, broker_lists(queue, transport_options), strict=True))
    return tuple(by_step[steps[bisect(steps, priority) - 1]] for priority in range(PRIORITIES))


def captured_messages(app: Any, queue: str, names: list[str]) -> list[dict[str, Any]]:
    """The kombu message a refill publish of each of ``names`` on ``queue`` writes, with markers for
    the task's values (``@@n@@`` as a name keeps the name's place too). Captured in one thread of its
    own: inside a task Celery would make each message that task's child (``parent_id``, ``root_id``),
    and the template would carry it for every message; and ``reply_to`` is the thread's."""
    captured: list[dict[str, Any]] = []
    failed: list[BaseException] = []

    def capture() -> None:
        try:
            with Connection("memory://") as connection:
                channel = connection.channel()
                try:
                    # kombu's in-memory broker is one per process: a capture that failed half-way
                    # may have left a message in the queue, which would be read back as this one's.
                    channel.queue_purge(queue)
                    for name in names:
                        app.send_task(name, args=["@@i@@"], queue=queue, priority=0, task_id="@@i@@.@@x@@",
                                      producer=Producer(channel), argsrepr=repr(["@@i@@"]), kwargsrepr="{}",
                                      add_to_parent=False)
                        captured.append(channel._get(queue))
                finally:
                    channel.close()
        except BaseException as exc:  # handed to the caller
            failed.append(exc)

    thread = threading.Thread(target=capture, name="celery-ha-capture", daemon=True)
    thread.start()
    thread.join(CAPTURE_TIMEOUT)
    if failed:
        raise failed[0]
    if len(captured) != len(names):
        raise TimeoutError(f"capturing messages took more than {CAPTURE_TIMEOUT:g} s")
    for message in captured:
        properties = message["properties"]
        if properties.get("body_encoding") == "base64":
            message["body"] = base64.b64decode(message["body"]).decode()
        properties["body_encoding"] = None
        properties["priority"] = "@@p@@"
        properties["delivery_tag"] = "@@x@@"
    return captured


def template_of(message: dict[str, Any]) -> tuple[str, ...]:
    """``message`` as JSON, cut at its markers: fragment, code, fragment, ..., fragment."""
    text = json.dumps(message)
    parts: list[str] = []
    at = 0
    for match in _MARKER.finditer(text):
        parts += [text[at:match.start()], MARKERS[match.group()]]
        at = match.end()
    parts.append(text[at:])
    return tuple(parts)


class _Plan:
    """This process's answer for one app and one set of services: the ListPush, or why there is none."""

    def __init__(self) -> None:
        self.made_for: tuple[Any, Services, int] | None = None  # app and services held: no id reuse
        self.push: ListPush | None = None
        self.why_not = ""
        self.unexpected = False  # off because of how Celery or kombu behave, not the configuration

    def is_for(self, app: Any, rt: Services) -> bool:
        made = self.made_for
        return made is not None and made[0] is app and made[1] is rt and made[2] == len(REGISTRY)

    def build(self, app: Any, rt: Services) -> None:
        """Decide for ``app`` and ``rt`` (and the durable tasks registered now). Anything unexpected
        means no push, but a soft time limit of the task that asked goes on up (and the next call
        decides again)."""
        unexpected = False
        try:
            why_not = _refusal(app, rt)
            push = None if why_not else _list_push(app, rt)
            if push is None and not why_not:
                why_not = "the crawl queue's messages differ from what the script can push"
        except SoftTimeLimitExceeded:
            raise
        except Exception as exc:  # a Celery or kombu this code does not know: publish from Python
            push, why_not, unexpected = None, f"no push could be built ({type(exc).__name__}: {exc})", True
        self.made_for, self.push, self.why_not = (app, rt, len(REGISTRY)), push, why_not
        self.unexpected = unexpected


def _refusal(app: Any, rt: Services) -> str:
    """Why the script cannot push for ``app`` and ``rt`` (see the module docstring), or ''."""
    conf, settings = app.conf, rt.settings
    if not settings.script_push:
        return "CELERY_HA_SCRIPT_PUSH=0"
    if not _broker_db(app, rt)[0]:
        return "the broker is not a Redis on the state's server"
    if rt.queue.shard_count != 1:
        return "a sharded namespace"
    if settings.largest_batch != 1:
        return "batches (CELERY_HA_BATCH)"
    if conf.task_send_sent_event:
        return "task-sent events"
    if str(conf.task_serializer) != "json" or int(conf.task_protocol or 2) != 2:
        return "a task serializer or protocol other than JSON, protocol 2"
    if any(spec.queue != CRAWL for spec in REGISTRY.values()):
        return "a durable task of another queue"
    return ""


def _broker_db(app: Any, rt: Services) -> tuple[bool, int | None]:
    """Where the app's broker is, against the state Redis: Celery publishes to ``broker_write_url``
    when set, else ``broker_url``; both must be the same. Under Sentinel, only a broker built from
    the state's own URL (``CELERY_BROKER_URL`` unset) is known to be the state's master."""
    conf = app.conf
    url = str(conf.broker_url or "")
    if str(conf.broker_write_url or url) != url:
        return False, None
    if is_sentinel_url(rt.redis_url):
        own = kombu_broker(rt.redis_url, rt.settings)
        options = dict(conf.broker_transport_options or {})
        same = rt.settings.broker_url is None and url == own.url and \
            options.get("master_name") == own.transport_options.get("master_name")
        return same, None
    return broker_db(url, rt.redis_url)


def broker_place(app: Any, rt: Services) -> str:
    """Where ``app``'s broker is, against the state Redis, in the words the worker registry records
    (``celery-ha`` commands compare their own broker's, ``cli/pump_hint.py``): ``state`` (the state
    Redis's own database), ``state-db:N`` (database N of its server) or ``elsewhere``."""
    return place_words(*_broker_db(app, rt))


def place_words(on_server: bool, db: int | None) -> str:
    """``broker_db``'s answer in the words the worker registry records (``broker_place``)."""
    if not on_server:
        return "elsewhere"
    return "state" if db is None else f"state-db:{db}"


def _list_push(app: Any, rt: Services) -> ListPush | None:
    """The ListPush for ``app``'s crawl queue; None when a message the script would push is not the
    one Celery would publish: the queue is routed through an exchange (kombu delivers through the
    exchange's bindings), its lists expire (kombu refreshes their expiry on every publish), a task's
    messages expire (the expiry is a time, counted from each publish), or the
    registered durable tasks do not all publish alike (routes, expiry, time limits or compression of
    their own). The template is theirs, so it carries what they share (the app's time limits); a
    task name this process did not register gets the same."""
    queue = broker_queue(rt.settings.namespace, CRAWL)
    declared = app.amqp.queues.get(queue)
    if declared is not None and (declared.expires or (declared.queue_arguments or {}).get("x-expires")):
        return None
    names = sorted(REGISTRY) or ["@@n@@"]  # the registered tasks' own options (time limits, ...)
    templates = set()
    for message in captured_messages(app, queue, names):
        if message["properties"].get("delivery_info") != {"exchange": "", "routing_key": queue}:
            return None
        if message["headers"].get("eta") or message["headers"].get("expires"):
            return None  # a time of the capture's own (an expiry counts from the publish)
        message["headers"]["task"] = "@@n@@"
        templates.add(template_of(message))
    if len(templates) != 1:  # one template serves every task: they must publish alike
        return None
    template = templates.pop()
    if not {"i", "n", "x"} <= set(template[1::2]):
        raise UnknownMessage("the message Celery writes has no place for the task id, name or delivery tag")
    return ListPush(keys=list_keys(queue, dict(app.conf.broker_transport_options or {})),
                    template=template, db=_broker_db(app, rt)[1])


#: This process's plans, one per namespace it serves (each has its own crawl queue and lists).
_plans: PerProcess[dict[str, _Plan]] = PerProcess(dict)


def _plan_for(rt: Services) -> _Plan:
    plans = _plans.get()
    plan = plans.get(rt.settings.namespace)
    if plan is None:
        plan = plans.setdefault(rt.settings.namespace, _Plan())
    return plan


def script_push(app: Any, rt: Services) -> ListPush | None:
    """What a completion's script needs to push its refill messages itself, or None to publish them
    from Python (see the module docstring). Decided once per process, app and services; the publish
    signals are looked at on every call (a tracing hook may connect later)."""
    plan = _plan_for(rt)
    if not plan.is_for(app, rt):
        plan.build(app, rt)
        log.debug("refill messages %s", "pushed by the completion's script" if plan.push
                  else f"published from Python ({plan.why_not})")
    if plan.push is None or signals.before_task_publish.receivers or signals.after_task_publish.receivers:
        return None
    return plan.push


def startup_decision(app: Any, rt: Services) -> str:
    """The dispatch path of ``app``'s refill messages in this process, decided now, in words (the
    worker's start-up line). Off for a reason of Celery's or kombu's own: one WARNING says why."""
    plan = _plan_for(rt)
    if not plan.is_for(app, rt):
        plan.build(app, rt)
        if plan.unexpected:
            log.warning("celery-ha's script push is off, refills are published from Python: %s "
                        "(verified on %s)", plan.why_not, VERIFIED)
    if plan.push is None:
        return f"Python publish ({plan.why_not})"
    if signals.before_task_publish.receivers or signals.after_task_publish.receivers:
        return "Python publish (a receiver of before_task_publish or after_task_publish)"
    return "script push"


def push_refused(error: str) -> None:
    """A script's push was refused: this process publishes from Python from now on, unless Redis was
    only full (OOM: the Python publish of what was left fails alike, and the pump re-sends it later)."""
    if error.startswith("OOM"):
        log.debug("refill push refused, Redis is full: %s", error)
        return
    for plan in _plans.get().values():  # every namespace's: they share the server and the account
        if plan.push is not None:
            log.warning("the completion script could not push refill messages (%s): this process "
                        "publishes them from Python from now on", error)
            plan.push, plan.why_not = None, f"a push was refused: {error}"
