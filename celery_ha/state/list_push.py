"""A completion that pushes its refill messages itself: where to, and what each message looks like.

``complete_dispatch.lua`` moves the next tasks to dispatched; each then needs one broker message.
When the broker keeps its queues as lists on the same Redis server (Celery's Redis transport, the
state Redis by default), the script can push those messages itself, as its last step: no publish
from Python, no round trip of its own. What a message looks like is the broker's business, so the
caller hands it in as a template (:class:`ListPush`), and the script only puts each task's values
between its fragments (``_push.lua``). A task the script does not push (a re-send, an id or name
that would need escaping, a refused command) comes back to the caller to send as usual.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from celery_ha.base.errors import InvalidInput

#: The values a template can hold, by code: task id, task name, message priority, message token.
CODES = frozenset("inpx")

#: Message priorities: one list key each (0 is served first).
PRIORITIES = 10

#: Bytes of template at most (a Celery message's envelope is under 1 kB).
MAX_TEMPLATE_BYTES = 16_384


def message_priority(priority: int) -> int:
    """The message priority of a task priority (-1000..1000, higher runs first): 3 - priority,
    clamped to 0..9 (0 is served first). The script computes the same."""
    return max(0, min(PRIORITIES - 1, 3 - int(priority)))


@dataclass(frozen=True)
class ListPush:
    """Where a completion's script pushes the messages it dispatched, and their template.

    ``keys``: the list of each message priority 0..9. ``template``: fragments with the one-letter
    codes of :data:`CODES` between them (fragment, code, fragment, ..., fragment). ``db``: the
    database of those lists on the state Redis's server (None: the state's own database).
    """

    keys: tuple[str, ...]
    template: tuple[str, ...]
    db: int | None = None

    def __post_init__(self) -> None:
        if len(self.keys) != PRIORITIES or not all(isinstance(k, str) and k for k in self.keys):
            raise InvalidInput(f"a list push needs {PRIORITIES} list keys (one per message priority)")
        if len(self.template) % 2 != 1 or not all(isinstance(t, str) for t in self.template):
            raise InvalidInput("a list push template alternates fragments and codes, fragments at both ends")
        if any(code not in CODES for code in self.template[1::2]):
            raise InvalidInput(f"template codes are one of {''.join(sorted(CODES))}")
        if sum(len(t.encode()) for t in self.template) > MAX_TEMPLATE_BYTES:
            raise InvalidInput(f"a list push template is at most {MAX_TEMPLATE_BYTES} bytes")
        if self.db is not None and (type(self.db) is not int or not 0 <= self.db < 2**31):
            raise InvalidInput(f"a list push database is a non-negative integer, got {self.db!r}")

    def args(self) -> list[str]:
        """The script's push section for one call (a fresh nonce each time)."""
        return ["" if self.db is None else str(self.db), *self.keys, secrets.token_hex(8), *self.template]

