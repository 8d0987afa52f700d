"""The runner's epoll set: one tag per fd, events as (fd, tag) pairs.

``selectors`` builds a key object per registration and per event, and needs an
``unregister`` (one syscall) before each close; the runner registers and drops
two pipes per item. Here a pipe that reached end of file is simply forgotten
and closed: closing the only descriptor of an open file removes it from every
epoll set, so the kernel does the unregistering for free. A persistent worker's
pipes are watched once for the worker's life (output_watch.py), with no
syscall per item.
"""

from __future__ import annotations

import contextlib
import select
import selectors
from collections.abc import Mapping
from typing import Any


class Poller(selectors.BaseSelector):
    """An epoll set whose registrations carry a tag (returned with each event).

    The ``selectors`` methods are kept for callers that use the common
    interface (the store's wake-up fd); the per-item path uses ``watch``,
    ``forget`` and ``ready``."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._tags: dict[int, Any] = {}

    def watch(self, fd: int, tag: Any) -> None:
        """Report ``fd`` (readable, or at end of file) with ``tag``."""
        try:
            self._epoll.register(fd, select.EPOLLIN)
        except FileExistsError:  # in the set already (under another tag): only the tag changes
            self._epoll.modify(fd, select.EPOLLIN)
        self._tags[fd] = tag

    def tag(self, fd: int) -> Any:
        """The tag ``fd`` is reported with (None if it is not watched)."""
        return self._tags.get(fd)

    def forget(self, fd: int) -> None:
        """Stop reporting ``fd``, which the caller closes next and holds no
        other descriptor of (the close takes it out of the epoll set)."""
        self._tags.pop(fd, None)

    def unwatch(self, fd: int) -> None:
        """Stop reporting ``fd``, which stays open (a persistent worker's pipe
        between two items): it leaves the epoll set now."""
        del self._tags[fd]
        self._epoll.unregister(fd)

    def ready(self, timeout: float | None) -> list[tuple[int, Any]]:
        """(fd, tag) of every fd ready within ``timeout`` seconds (None: no limit)."""
        tags = self._tags
        # Room for every fd in one batch: a persistent worker's output written
        # before its reply is then read in the reply's batch (output_watch.py).
        found = self._epoll.poll(-1 if timeout is None else timeout, len(tags) + 1)
        return [(fd, tags[fd]) for fd, _ in found if fd in tags]

    # -- the selectors interface ---------------------------------------------------

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        self.watch(fd, data)
        return selectors.SelectorKey(fileobj, fd, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        tag = self._tags.pop(fd)  # KeyError if not registered, as in selectors
        # As selectors does: the fd may be closed already (a store's dropped
        # connection), which took it out of the epoll set.
        with contextlib.suppress(OSError):
            self._epoll.unregister(fd)
        return selectors.SelectorKey(fileobj, fd, selectors.EVENT_READ, tag)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        return [
            (selectors.SelectorKey(fd, fd, selectors.EVENT_READ, tag), selectors.EVENT_READ)
            for fd, tag in self.ready(timeout)
        ]

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return {
            fd: selectors.SelectorKey(fd, fd, selectors.EVENT_READ, tag)
            for fd, tag in self._tags.items()
        }

    def close(self) -> None:
        self._epoll.close()
        self._tags.clear()
