"""Which queue a ``map`` or ``@resumable`` keeps its results in, and calls
that would wait for themselves.

Without ``queue=``, the results of ``fn`` are kept in a queue named for it
(``crawl.fetch-`` and a short hash, for ``fetch`` defined in ``crawl.py``), never in
``$STATEQUEUE_QUEUE``: a program that ``run`` starts has that variable set to
the run's own queue, and a helper's cache put there became the run's items
(and two functions sharing one default queue read each other's results,
keyed by the item's text alone). A lambda, a nested function or another
callable without a stable name must be given ``queue=``.

A call made inside ``fn`` for the same item on the same queue (``parse(u)``
calling ``download(u)``, both ``@resumable(queue="p")``, or ``fn`` calling
itself) would wait for the outer call's claim forever; it is refused
instead (UsageError). Known per thread and per asyncio task (a context
variable), so another thread asking for the same item still waits for it --
and so does a call ``fn`` hands to a thread of its own (an executor): not
caught, it waits forever. Not seen across processes (``processes=True``).
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from types import ModuleType
from typing import Any

from statequeue.api.queue import Queue
from statequeue.core.errors import UsageError
from statequeue.core.location import validate_queue_name

__all__ = ["QueueKey", "default_queue", "queue_key", "refuse_nested", "working_on"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_READABLE = 100  # characters of the name before its hash

QueueKey = tuple[object, ...]
# The (queue, item id) pairs whose fn this thread or task is inside of.
_WORKING: ContextVar[tuple[tuple[QueueKey, int], ...]] = ContextVar(
    "statequeue_map_working", default=()
)


def default_queue(fn: Callable[..., Any], what: str) -> str:
    """The queue name for ``fn``'s results: its module and qualified name
    (the script's file name for ``__main__``), shortened and made safe, with
    a short hash of the whole name (the script's full path for ``__main__``)
    so that two functions never share one: ``job.f-1a2b3c4d``. UsageError for
    a callable with no stable name, or a method bound to an object (its
    results may depend on the object: ``what`` names the call)."""
    qualname = getattr(fn, "__qualname__", None)
    module = getattr(fn, "__module__", None)
    if not isinstance(qualname, str) or not isinstance(module, str) or "<" in qualname:
        shown = qualname if isinstance(qualname, str) else type(fn).__name__
        raise UsageError(
            f"{what}: give queue=NAME: {shown!r} (a lambda, a nested function or a callable "
            "object) has no stable name to keep its results under"
        )
    bound = getattr(fn, "__self__", None)
    if bound is not None and not isinstance(bound, (type, ModuleType)):
        raise UsageError(
            f"{what}: give queue=NAME: {qualname!r} is bound to an object, and its results "
            "may differ from one object to another"
        )
    whole = f"{module}:{qualname}"
    if module == "__main__":
        main = getattr(sys.modules.get("__main__"), "__file__", None)
        if isinstance(main, str) and main:
            module = Path(main).stem
            whole = f"{Path(main).resolve()}:{qualname}"
    readable = _UNSAFE.sub("_", f"{module}.{qualname}").lstrip(".")[:_READABLE] or "map"
    digest = hashlib.sha1(whole.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return validate_queue_name(f"{readable}-{digest}")


def queue_key(queue: Queue) -> QueueKey:
    """What tells one queue from another within this process."""
    store = queue.store
    folder = getattr(store, "folder", None)
    return (type(store).__name__, str(folder) if folder is not None else id(store), queue.name)


@contextmanager
def working_on(key: QueueKey, item_id: int) -> Iterator[None]:
    """Mark this thread (or task) as inside ``fn`` for ``item_id`` of ``key``."""
    token = _WORKING.set((*_WORKING.get(), (key, item_id)))
    try:
        yield
    finally:
        _WORKING.reset(token)


def refuse_nested(key: QueueKey, left: Collection[int], texts: Callable[[int], str]) -> None:
    """UsageError if an item this call would run is one the caller is inside
    of (the same queue): it would wait for its own claim forever."""
    for outer_key, item_id in _WORKING.get():
        if outer_key == key and item_id in left:
            raise UsageError(
                f"item {texts(item_id)!r} of queue {key[-1]} is already being worked on by "
                "the call this one runs inside (a map or resumable function on the same "
                "queue, asked again for the same item): it would wait for itself forever; "
                "give the inner function a queue of its own"
            )
