"""The durable task layer (Redis + Lua)."""

from celery_ha.state.records import STATE_NAMES, Dispatched, Lease, TaskInfo
from celery_ha.state.taskqueue import TaskQueue, task_id_for

__all__ = ["STATE_NAMES", "Dispatched", "Lease", "TaskInfo", "TaskQueue", "task_id_for"]
