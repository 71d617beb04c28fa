"""The durable task layer (Redis + Lua)."""

from .records import STATE_NAMES, Dispatched, Lease, TaskInfo
from .taskqueue import TaskQueue, task_id_for

__all__ = ["STATE_NAMES", "Dispatched", "Lease", "TaskInfo", "TaskQueue", "task_id_for"]
