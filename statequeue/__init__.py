"""statequeue: a resumable, crash-safe work queue for the shell and for Python."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from statequeue.errors import (
    InvalidResult,
    ItemNotFound,
    MapFailed,
    NotSupported,
    QueueClosed,
    StateQueueError,
    UsageError,
)
from statequeue.models import Claim, EnqueueResult, ItemState, OnInterrupted, Outcome
from statequeue.queue import Queue, WorkItem
from statequeue.work import WorkPolicy

if TYPE_CHECKING:
    from statequeue.aio import AsyncWorkItem, map_async
    from statequeue.mapping import map, resumable
    from statequeue.views import ItemHistory, ItemResult, ItemView, Status

# Imported on first use: asyncio alone costs more than the CLI's whole start-up.
_LAZY = {
    "AsyncWorkItem": "statequeue.aio",
    "map_async": "statequeue.aio",
    "map": "statequeue.mapping",
    "resumable": "statequeue.mapping",
    "ItemHistory": "statequeue.views",
    "ItemResult": "statequeue.views",
    "ItemView": "statequeue.views",
    "Status": "statequeue.views",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'statequeue' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AsyncWorkItem",
    "Claim",
    "EnqueueResult",
    "InvalidResult",
    "ItemHistory",
    "ItemNotFound",
    "ItemResult",
    "ItemState",
    "ItemView",
    "MapFailed",
    "NotSupported",
    "OnInterrupted",
    "Outcome",
    "Queue",
    "QueueClosed",
    "StateQueueError",
    "Status",
    "UsageError",
    "WorkItem",
    "WorkPolicy",
    "map",
    "map_async",
    "resumable",
]
__version__ = "0.1.0"
