"""statequeue: a resumable, crash-safe work queue for the shell and for Python."""

from __future__ import annotations

import importlib  # already loaded by the interpreter: costs nothing here
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from statequeue.api.map_async import map_async
    from statequeue.api.mapping import map, resumable
    from statequeue.api.queue import Queue
    from statequeue.api.serve import serve
    from statequeue.api.work import WorkItem, WorkPolicy
    from statequeue.api.work_async import AsyncWorkItem
    from statequeue.core.errors import (
        InvalidResult,
        ItemNotFound,
        MapFailed,
        NotSupported,
        PoolBroken,
        QueueClosed,
        StateQueueError,
        TryLater,
        UnknownState,
        UsageError,
    )
    from statequeue.core.models import Claim, EnqueueResult, ItemState, OnInterrupted, Outcome
    from statequeue.core.views import ItemHistory, ItemResult, ItemView, Status

# Every name is imported on first use. asyncio alone costs more than the CLI's
# whole start-up; and the CLI's entry (statequeue.cli.main) must run before
# anything heavy is imported, to let Ctrl-C end the process during its imports.
_ERRORS = (
    *("InvalidResult", "ItemNotFound", "MapFailed", "NotSupported", "QueueClosed"),
    "PoolBroken",
    "TryLater",
    "UnknownState",
)
_MODELS = ("Claim", "EnqueueResult", "ItemState", "OnInterrupted", "Outcome")
_LAZY = {
    **dict.fromkeys((*_ERRORS, "StateQueueError", "UsageError"), "statequeue.core.errors"),
    **dict.fromkeys(_MODELS, "statequeue.core.models"),
    "Queue": "statequeue.api.queue",
    "WorkItem": "statequeue.api.work",
    "WorkPolicy": "statequeue.api.work",
    "AsyncWorkItem": "statequeue.api.work_async",
    "map_async": "statequeue.api.map_async",
    "map": "statequeue.api.mapping",
    "resumable": "statequeue.api.mapping",
    "serve": "statequeue.api.serve",
    "ItemHistory": "statequeue.core.views",
    "ItemResult": "statequeue.core.views",
    "ItemView": "statequeue.core.views",
    "Status": "statequeue.core.views",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'statequeue' has no attribute {name!r}")
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
    "PoolBroken",
    "Queue",
    "QueueClosed",
    "StateQueueError",
    "Status",
    "TryLater",
    "UnknownState",
    "UsageError",
    "WorkItem",
    "WorkPolicy",
    "map",
    "map_async",
    "resumable",
    "serve",
]
__version__ = "0.1.0"
