"""Operations on a whole queue that may not open: check, repair, drop, list.

``Queue.fsck`` and ``Queue.drop`` use these for an open queue; the CLI uses
them by name, since a damaged queue refuses to open (promise 5) and must
still be checked, repaired or dropped. They work on local queue folders;
another store raises NotSupported.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from statequeue.errors import DamagedState, NotSupported, UsageError
from statequeue.location import resolve_home
from statequeue.store.opening import chosen_url

if TYPE_CHECKING:
    from statequeue.store.fsck import FsckReport
    from statequeue.views import ActiveRunner, Status


def fsck_queue(
    name: str | None = None,
    *,
    home: str | os.PathLike[str] | None = None,
    store: str | None = None,
    repair: bool = False,
) -> FsckReport:
    """Check (and with ``repair``, salvage) queue ``name``, even one too damaged to open."""
    from statequeue.queue import queue_folder

    _refuse_url(store, "fsck")
    return fsck_folder(queue_folder(name, home), repair=repair)


def fsck_folder(folder: Path, *, repair: bool) -> FsckReport:
    """Check every record of the queue in ``folder`` (see ``statequeue.store.fsck``)."""
    from statequeue.store.fsck import fsck

    return fsck(folder, repair=repair)


def drop_queue(
    name: str,
    *,
    home: str | os.PathLike[str] | None = None,
    store: str | None = None,
    confirm: Callable[[Path], None] | None = None,
) -> Path:
    """Delete queue ``name`` with everything in it, once no runner is active on
    it (UsageError otherwise); ``confirm(folder)`` is called first and may raise
    to stop. A damaged queue can be dropped too. Returns the folder removed."""
    from statequeue.store.folder import remove_queue_folder

    _refuse_url(store, "drop")
    folder = _idle_folder(name, home)
    if confirm is not None:
        confirm(folder)
    remove_queue_folder(folder)
    return folder


def drop_folder(
    name: str, folder: Path, runners: Sequence[ActiveRunner], *, before: Callable[[], None]
) -> None:
    """Delete the open queue ``name`` in ``folder`` unless ``runners`` are
    active; ``before`` (closing the queue) runs just before the files go."""
    from statequeue.store.folder import remove_queue_folder

    if runners:
        raise UsageError(
            f"queue {name!r} has an active runner (pid {runners[0].pid}); stop it first"
        )
    before()
    remove_queue_folder(folder)


def list_queues(
    home: str | os.PathLike[str] | None = None, *, store: str | None = None
) -> list[Status]:
    """The status of every queue under ``home``, by name."""
    from statequeue.queue import Queue
    from statequeue.store.integrity import holds_queue

    _refuse_url(store, "queues")
    root = resolve_home(home)
    # A folder whose journal is gone but whose archive remains is a damaged
    # queue (opening it refuses), never one to leave out silently.
    folders = sorted(p for p in root.iterdir() if holds_queue(p)) if root.is_dir() else []
    found = []
    for folder in folders:
        with Queue(folder.name, home=root, create=False, store=None) as q:
            found.append(q.status())
    return found


def _idle_folder(name: str, home: str | os.PathLike[str] | None) -> Path:
    """The queue's folder, once no runner is active on it. A damaged queue
    (which cannot be opened) can still be dropped: its runner locks decide."""
    from statequeue.queue import Queue, queue_folder
    from statequeue.store.locks import runner_locks_held

    try:
        q = Queue(name, home=home, create=False, store=None)
    except DamagedState:
        folder = queue_folder(name, home)
        if runner_locks_held(folder):
            raise UsageError(f"queue {name!r} has an active runner; stop it first") from None
        return folder
    try:
        runners = q.store.active_runners()
        if runners:
            raise UsageError(
                f"queue {name!r} has an active runner (pid {runners[0].pid}); stop it first"
            )
        assert q.path is not None  # a journal store always has its folder
        return q.path
    finally:
        q.close()


def _refuse_url(store: str | None, operation: str) -> None:
    if chosen_url(store) is not None:
        raise NotSupported(f"{operation} does not work with a PostgreSQL store yet")
