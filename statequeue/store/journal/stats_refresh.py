"""Bringing the `stats` summary cache up to a state checkpoint, off the caller's path.

Each time a journal store saves a state checkpoint it notes the files as they
stand (under the queue lock: descriptors of its own and the sizes that
count), and once the lock is released, ``stats.ckpt`` is extended from its
position to that point in a thread of this one's. `stats` after a long run
then folds only the records after the last checkpoint, and a compaction's
hook finds the summary current and carries it over.

A thread, so that the caller (a runner, between two items) does not wait for
the fold: at a 1M-item queue's checkpoint it reads ~125k records (~0.3 s);
the runner goes on and only shares the interpreter with it. One at a time:
a checkpoint noted while one runs waits for the next release of the lock
(only the newest is kept), and one still waiting when the store closes is
made then. Everything here is a cache: any failure leaves
``stats.ckpt`` as it was, and the store works the same.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from statequeue.store.journal.folder import QueueFolder
    from statequeue.store.journal.stats_cache import File

Files = tuple["File | None", "File"]
"""The archive (None if empty) and the journal, as ``stats_cache.summarise`` takes them."""


class StatsRefresher:
    def __init__(self, folder: QueueFolder) -> None:
        self._folder = folder
        self._due: Files | None = None
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> bool:
        return self._due is not None

    def note(self, files: Files) -> None:
        """Refresh up to ``files`` next (they are owned here from now on)."""
        if self._due is not None:
            _close(self._due)  # an older point: the newer one covers it
        self._due = files

    def start(self) -> None:
        """Start the refresh noted, unless one still runs (then at a later call)."""
        if self._due is None or (self._thread is not None and self._thread.is_alive()):
            return
        files, self._due = self._due, None
        self._thread = threading.Thread(
            target=_refresh, args=(self._folder, files), name="statequeue-stats", daemon=False
        )
        self._thread.start()

    def wait(self) -> None:
        """Let a running refresh finish, then make the one noted meanwhile, in
        this thread (before the files close). Dropped, it left the cache a
        checkpoint further behind than the run's last one: the last
        checkpoint of a run is often noted while the one before still folds."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._due is not None:
            files, self._due = self._due, None
            _refresh(self._folder, files)


def _refresh(folder: QueueFolder, files: Files) -> None:
    from statequeue.store.journal import stats_cache  # lazy: start-up time (stats modules)

    archive, journal = files
    try:
        # A compaction replaced the journal meanwhile: its own summary is newer.
        if os.stat(journal.path).st_ino == journal.inode:
            stats_cache.refresh(folder, archive, journal)
    except Exception:  # a cache, in a thread: nothing to report to, nothing lost
        pass  # the next checkpoint or `stats` tries again
    finally:
        _close(files)


def _close(files: Files) -> None:
    for f in files:
        if f is not None:
            os.close(f.fd)
