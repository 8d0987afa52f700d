"""A queue's store as a ``Queue`` holds it: opened by name (the local journal,
or PostgreSQL by URL), shared by the threads of one process (each call has it
alone), reopened in a child after ``os.fork``, and closed once.

``Queue`` keeps the methods users call; this keeps the store they go to.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

from statequeue.core.errors import InvalidQueueName, QueueClosed, QueueForked, UsageError
from statequeue.core.location import resolve_home, resolve_queue_name
from statequeue.store.base import Store
from statequeue.store.lease_hooks import check_lease
from statequeue.store.opening import chosen_url, open_journal, open_postgres


def queue_folder(name: str | None = None, home: str | os.PathLike[str] | None = None) -> Path:
    """The folder of queue ``name`` under ``home`` (both resolved as the CLI does)."""
    return resolve_home(home) / resolve_queue_name(name)


def check_location(name: object, home: object) -> None:
    """InvalidQueueName / UsageError for a name or home of the wrong type
    (they would fail deep inside as a TypeError)."""
    if name is not None and not isinstance(name, str):
        raise InvalidQueueName(f"queue name must be a str, not {type(name).__name__}")
    if home is not None and not isinstance(home, str | os.PathLike):
        raise UsageError(f"home must be a path (str or os.PathLike), not {type(home).__name__}")


class SharedStore:
    """One queue's store, for the threads of one process.

    ``reopen`` opens the same queue again, in a child after a fork; None for a
    store given ready-made, which a child cannot reopen (QueueForked)."""

    def __init__(self, store: Store, reopen: Callable[[], Store] | None) -> None:
        self._store = store
        self._reopen = reopen
        self.name = store.name
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._closed = False

    @classmethod
    def open(
        cls,
        name: str | None,
        *,
        home: str | os.PathLike[str] | None,
        create: bool,
        store: Store | str | None,
        auto_compact: int | None,
        lease: float | None,
    ) -> SharedStore:
        """Queue ``name``'s store: ``store`` itself, the PostgreSQL store at
        that URL, or by default ($STATEQUEUE_STORE unset) the local journal."""
        check_location(name, home)
        if store is not None and not isinstance(store, str | Store):
            # store=5 raised an AttributeError from deep in the opening.
            raise UsageError(f"store must be a URL (str) or a Store, not {type(store).__name__}")
        if lease is not None:
            check_lease(lease)  # before anything is opened
        reopen: Callable[[], Store] | None = None
        if store is None:
            store = chosen_url(None)
        if isinstance(store, str):
            url, queue_name = store, resolve_queue_name(name)
            scratch = resolve_home(home) / ".postgres" / queue_name
            reopen = partial(open_postgres, url, queue_name, create=False, scratch=scratch)
            store = open_postgres(url, queue_name, create=create, scratch=scratch)
        elif store is None:
            folder = queue_folder(name, home)
            store = open_journal(folder, create=create, auto_compact=auto_compact)
            reopen = partial(open_journal, folder, create=False, auto_compact=auto_compact)
        if lease is not None:  # claims' lease, in stores that have leases
            store.use_lease(lease)
        return cls(store, reopen)

    @property
    def store(self) -> Store:
        """The store, for this process (reopened after a fork) and while open."""
        if self._pid != os.getpid():
            self._after_fork()
        if self._closed:
            raise QueueClosed(f"queue {self.name!r} is closed")
        return self._store

    @property
    def opened(self) -> Store:
        """The store as last opened, unchecked: for what neither a fork nor
        ``close`` changes (its folder)."""
        return self._store

    def _after_fork(self) -> None:
        # The parent's store shares its open files (and so its flocks) with
        # this process: using it here would let both write the journal at once.
        # It is dropped without close(), which could write under the parent's lock.
        if self._reopen is None:
            raise QueueForked(
                f"queue {self.name!r} was opened in process {self._pid}, before a fork; "
                "open a new Queue in this process"
            )
        if not self._closed:
            self._store = self._reopen()  # if this raises, the next call tries again
        self._lock = threading.RLock()  # another thread may have held it at the fork
        self._pid = os.getpid()

    def using(self) -> _Using:
        """The store, held by this thread for one call (``with``)."""
        return _Using(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release the store's files; later uses raise QueueClosed. Idempotent."""
        if self._pid != os.getpid():
            self._closed = True  # the parent's files are the parent's to close
            return
        with self._lock:
            if not self._closed:
                self._closed = True
                self._store.close()


class _Using:
    """``SharedStore.using()``: a class, not a generator, as it is on every
    call's path (the runner makes one per item)."""

    __slots__ = ("_lock", "_shared")

    def __init__(self, shared: SharedStore) -> None:
        self._shared = shared

    def __enter__(self) -> Store:
        shared = self._shared
        _ = shared.store  # checks the process before taking a lock made before a fork
        self._lock = lock = shared._lock
        lock.acquire()
        if shared.closed:  # checked again: another thread may have closed it
            lock.release()
            raise QueueClosed(f"queue {shared.name!r} is closed")
        return shared._store  # the process was checked above (one getpid per call)

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
