"""Operations on a whole open queue: check it and drop it, on a local journal
and on PostgreSQL alike. ``Queue.fsck`` and ``Queue.drop`` call these; the
by-name forms for a queue that may not open are in ``maintenance``.

Which kind of store it is comes from the contract (``journal_folder``,
``url``), never from the store's type.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from statequeue.core.errors import NotSupported, QueueNotFound, RunnerActive, UsageError
from statequeue.store.base import Store
from statequeue.store.opening import (
    check_nested_folder,
    drop_postgres_queue,
    foreign_entries,
    fsck_folder,
    remove_folder,
)

if TYPE_CHECKING:
    from statequeue.core.views import ActiveRunner, QueueCheck


def check_store(store: Store, *, repair: bool) -> QueueCheck:
    """``fsck`` of an open store: a journal record by record in its folder,
    any other store by its own ``check`` (NotSupported where it has none)."""
    # Only the journal's folder holds the queue (another store's folder is scratch).
    folder = store.journal_folder()
    if folder is not None:
        return fsck_folder(folder, repair=repair)
    return store.check(repair=repair)


def drop_store(name: str, store: Store, *, before: Callable[[], None]) -> None:
    """Delete the open queue ``name`` held by ``store`` unless a runner is
    active on it; ``before`` (closing the queue) runs just before the delete."""
    folder = store.journal_folder()
    if folder is not None:
        drop_folder(name, folder, store.active_runners(), before=before)
        return
    if store.url is None:
        raise NotSupported(f"drop does not work with the {type(store).__name__}")
    # Refused while the queue is still open (a work loop of this Queue goes
    # on); the drop checks again under the row lock that runners register with.
    refuse_runners(name, store.active_runners())
    before()
    drop_postgres_queue(store.url, name)
    remove_scratch(store.folder)


def remove_scratch(folder: Path | None) -> None:
    """This host's scratch folder of a dropped database queue (logs of
    attempts, claim locks), where there is one."""
    if folder is not None and scratch_checked(folder):
        with contextlib.suppress(QueueNotFound):
            remove_folder(folder)


def scratch_checked(folder: Path) -> bool:
    """False if there is no HOME/.postgres; UnsafeFolder if it or the home
    fails the checks made when the store opens (a link, another user's):
    removing the folder alone would follow a planted .postgres link and
    delete a folder of the queue's name wherever it points."""
    if not os.path.lexists(folder.parent):
        return False
    check_nested_folder(folder.parents[1], folder.parent.name)
    return True


def drop_folder(
    name: str, folder: Path, runners: Sequence[ActiveRunner], *, before: Callable[[], None]
) -> None:
    """Delete the open queue ``name`` in ``folder`` unless ``runners`` are
    active; ``before`` (closing the queue) runs just before the files go."""
    refuse_runners(name, runners)
    refuse_foreign(folder)
    before()
    remove_folder(folder)


def refuse_foreign(folder: Path) -> None:
    """UsageError when queue folder ``folder`` also holds entries statequeue
    did not make (a user's file put there): a drop never deletes those."""
    if strangers := foreign_entries(folder):
        shown = ", ".join(strangers[:3]) + (", ..." if len(strangers) > 3 else "")
        raise UsageError(
            f"{folder} also holds {shown}, which statequeue did not make: not dropped "
            "(move them out, then drop again)"
        )


def refuse_runners(name: str, runners: Sequence[ActiveRunner]) -> None:
    """RunnerActive (exit 4) naming the first of ``runners`` active on queue ``name``."""
    if runners:
        raise RunnerActive(
            f"queue {name!r} has an active runner (pid {runners[0].pid}); stop it first"
        )
