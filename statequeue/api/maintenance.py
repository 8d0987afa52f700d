"""Operations on a whole queue that may not open: check, repair, drop, list.

One code path for every store: ``Queue.fsck`` and ``Queue.drop`` use these
for an open queue, and the CLI uses them by name, since a damaged local queue
refuses to open (promise 5) and must still be checked, repaired or dropped.
A PostgreSQL store (``store=`` a URL, or $STATEQUEUE_STORE) is checked by
recounting its rows, dropped row by row, and listed from its database.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from statequeue.core.errors import (
    DamagedState,
    NotSupported,
    QueueNotFound,
    UnsafeFolder,
    UsageError,
)
from statequeue.core.location import resolve_home, validate_queue_name
from statequeue.store.opening import chosen_url

if TYPE_CHECKING:
    from statequeue.core.views import ActiveRunner, QueueCheck, Status
    from statequeue.store.base import Store
    from statequeue.store.journal.fsck import FsckReport


def fsck_queue(
    name: str | None = None,
    *,
    home: str | os.PathLike[str] | None = None,
    store: str | None = None,
    repair: bool = False,
) -> QueueCheck:
    """Check (and with ``repair``, salvage or correct) queue ``name``: a local
    one even when too damaged to open (a ``FsckReport``), one in a PostgreSQL
    store by recounting its rows (a ``StoreCheck``; QueueNotFound if missing)."""
    from statequeue.api.queue import Queue, queue_folder

    url = chosen_url(store)
    if url is not None:
        with Queue(name, home=home, store=url, create=False) as q:
            return q.fsck(repair=repair)
    return fsck_folder(queue_folder(name, home), repair=repair)


def check_store(store: Store, *, repair: bool) -> QueueCheck:
    """``fsck`` of an open store: a journal record by record in its folder,
    any other store by its own ``check`` (NotSupported where it has none)."""
    from statequeue.store.journal.store import JournalStore

    # Only the journal's folder holds the queue (another store's folder is scratch).
    if isinstance(store, JournalStore):
        return fsck_folder(store.folder, repair=repair)
    return store.check(repair=repair)


def fsck_folder(folder: Path, *, repair: bool) -> FsckReport:
    """Check every record of the queue in ``folder`` (see ``statequeue.store.journal.fsck``)."""
    from statequeue.store.journal.fsck import fsck

    return fsck(folder, repair=repair)


def drop_queue(
    name: str,
    *,
    home: str | os.PathLike[str] | None = None,
    store: str | None = None,
    confirm: Callable[[str], None] | None = None,
) -> str:
    """Delete queue ``name`` with everything in it, once no runner is active on
    it (UsageError otherwise). ``confirm(place)`` is called first and may raise
    to stop; ``place`` is the queue's folder, or the store's URL (password
    masked). A damaged local queue can be dropped too; an interrupted drop from
    a PostgreSQL store is finished by dropping again. Returns ``place``."""
    from statequeue.store.journal.folder import remove_queue_folder

    url = chosen_url(store)
    if url is not None:
        scratch = resolve_home(home) / ".postgres" / validate_queue_name(name)
        _scratch_checked(scratch)  # an unsafe one stops the drop before it starts
        place = _drop_from_database(url, name, confirm)
        _remove_scratch(scratch)
        return place
    folder = _idle_folder(name, home)
    if confirm is not None:
        confirm(str(folder))
    remove_queue_folder(folder)
    return str(folder)


def _drop_from_database(url: str, name: str, confirm: Callable[[str], None] | None) -> str:
    from statequeue.store.opening import drop_postgres_queue
    from statequeue.store.urls import mask

    validate_queue_name(name)
    place = mask(url)
    if confirm is not None:
        confirm(place)
    # Not opened first (it would hold the queue): the drop itself refuses
    # while a runner is active, under the row lock runners register with.
    drop_postgres_queue(url, name)
    return place


def drop_store(name: str, store: Store, *, before: Callable[[], None]) -> None:
    """Delete the open queue ``name`` held by ``store`` unless a runner is
    active on it; ``before`` (closing the queue) runs just before the delete."""
    from statequeue.store.journal.store import JournalStore
    from statequeue.store.opening import drop_postgres_queue

    if isinstance(store, JournalStore):
        drop_folder(name, store.folder, store.active_runners(), before=before)
        return
    if store.url is None:
        raise NotSupported(f"drop does not work with the {type(store).__name__}")
    # Refused while the queue is still open (a work loop of this Queue goes
    # on); the drop checks again under the row lock that runners register with.
    _refuse_runners(name, store.active_runners())
    before()
    drop_postgres_queue(store.url, name)
    _remove_scratch(getattr(store, "folder", None))


def _remove_scratch(folder: Path | None) -> None:
    """This host's scratch folder of a dropped database queue (logs of
    attempts, claim locks), where there is one."""
    from statequeue.store.journal.folder import remove_queue_folder

    if folder is not None and _scratch_checked(folder):
        with contextlib.suppress(QueueNotFound):
            remove_queue_folder(folder)


def _scratch_checked(folder: Path) -> bool:
    """False if there is no HOME/.postgres; UnsafeFolder if it or the home
    fails the checks made when the store opens (a link, another user's):
    remove_queue_folder alone would follow a planted .postgres link and
    delete a folder of the queue's name wherever it points."""
    from statequeue.store.journal.folder import QueueFolder

    if not os.path.lexists(folder.parent):
        return False
    QueueFolder.open_nested(folder.parents[1], folder.parent.name).close()
    return True


def drop_folder(
    name: str, folder: Path, runners: Sequence[ActiveRunner], *, before: Callable[[], None]
) -> None:
    """Delete the open queue ``name`` in ``folder`` unless ``runners`` are
    active; ``before`` (closing the queue) runs just before the files go."""
    from statequeue.store.journal.folder import remove_queue_folder

    _refuse_runners(name, runners)
    before()
    remove_queue_folder(folder)


def _refuse_runners(name: str, runners: Sequence[ActiveRunner]) -> None:
    if runners:
        raise UsageError(
            f"queue {name!r} has an active runner (pid {runners[0].pid}); stop it first"
        )


def list_queues(
    home: str | os.PathLike[str] | None = None,
    *,
    store: str | None = None,
    on_unsafe: Callable[[UnsafeFolder], None] | None = None,
    on_damaged: Callable[[str, DamagedState], None] | None = None,
) -> list[Status]:
    """The status of every queue under ``home`` (or in the PostgreSQL store
    ``store``), by name. An unsafe entry in the home (a link, another user's
    folder) raises UnsafeFolder, or with ``on_unsafe`` is passed to it and
    left out; an unsafe home raises either way. A queue too damaged to open
    raises DamagedState, or with ``on_damaged`` is passed to it (with its
    name) and left out, so one damaged queue does not hide the others."""
    from statequeue.api.queue import Queue
    from statequeue.store.journal.folder import open_home
    from statequeue.store.journal.integrity import holds_queue

    url = chosen_url(store)
    if url is not None:
        from statequeue.store.opening import postgres_queues

        return postgres_queues(url)
    root = resolve_home(home)
    # A folder whose journal is gone but whose archive remains is a damaged
    # queue (opening it refuses), never one to leave out silently.
    if not root.is_dir():
        return []
    os.close(open_home(root, create=False))  # an unsafe home is never skipped
    found = []
    for folder in sorted(root.iterdir()):
        try:
            if holds_queue(folder):
                with Queue(folder.name, home=root, create=False, store=None) as q:
                    found.append(q.status())
        except UnsafeFolder as exc:
            if on_unsafe is None:
                raise
            on_unsafe(exc)
        except DamagedState as exc:
            if on_damaged is None:
                raise
            on_damaged(folder.name, exc)
    return found


def queues_place(
    home: str | os.PathLike[str] | None = None, *, store: str | None = None
) -> tuple[str, str]:
    """Where ``list_queues`` looks: ``("home", folder)`` or ``("store", masked URL)``."""
    url = chosen_url(store)
    if url is not None:
        from statequeue.store.urls import mask

        return "store", mask(url)
    return "home", str(resolve_home(home))


def _idle_folder(name: str, home: str | os.PathLike[str] | None) -> Path:
    """The queue's folder, once no runner is active on it. A damaged queue
    (which cannot be opened) can still be dropped: its runner locks decide."""
    from statequeue.api.queue import Queue, queue_folder
    from statequeue.store.journal.locks import runner_locks_held

    try:
        q = Queue(name, home=home, create=False, store=None)
    except DamagedState:
        folder = queue_folder(name, home)
        if runner_locks_held(folder):
            raise UsageError(f"queue {name!r} has an active runner; stop it first") from None
        return folder
    try:
        _refuse_runners(name, q.store.active_runners())
        assert q.path is not None  # a journal store always has its folder
        return q.path
    finally:
        q.close()
