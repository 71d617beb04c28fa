"""The durable task layer (Redis + Lua): task records, fenced leases, checkpoints and the output sink.

``TaskQueue`` is the client; every state transition is one atomic Lua script beside it.
"""

from celery_ha.state.ids import task_id_for
from celery_ha.state.records import STATE_NAMES, Dispatched, Lease, TaskInfo, TaskState
from celery_ha.state.replies import Refusal
from celery_ha.state.taskqueue import TaskQueue

__all__ = [
    "STATE_NAMES",
    "Dispatched",
    "Lease",
    "Refusal",
    "TaskInfo",
    "TaskQueue",
    "TaskState",
    "task_id_for",
]
