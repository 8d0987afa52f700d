"""statequeue: a resumable, crash-safe work queue for the shell and for Python."""

from __future__ import annotations

from statequeue.errors import StateQueueError
from statequeue.models import Claim, EnqueueResult, ItemState, OnInterrupted, Outcome
from statequeue.queue import Queue, WorkItem

__all__ = [
    "Claim",
    "EnqueueResult",
    "ItemState",
    "OnInterrupted",
    "Outcome",
    "Queue",
    "StateQueueError",
    "Status",
    "WorkItem",
]
__version__ = "0.1.0"
