"""Operations on a whole queue by name, for a queue that may not open:
check, repair, drop, list.

The CLI uses these, since a damaged local queue refuses to open (promise 5)
and must still be checked, repaired or dropped; they share their code with
an open queue's ``Queue.fsck`` and ``Queue.drop`` (``queue_whole``).
A PostgreSQL store (``store=`` a URL, or $STATEQUEUE_STORE) is checked by
recounting its rows, dropped row by row, and listed from its database.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from statequeue.api.queue import Queue
from statequeue.api.queue_whole import (
    refuse_foreign,
    refuse_runners,
    remove_scratch,
    scratch_checked,
)
from statequeue.api.shared_store import queue_folder
from statequeue.core.errors import (
    DamagedState,
    FolderAtFileName,
    NoAccess,
    RunnerActive,
    UnsafeFolder,
    UsageError,
    os_error_text,
)
from statequeue.core.location import resolve_home, validate_queue_name
from statequeue.store.opening import (
    check_home,
    chosen_url,
    drop_postgres_queue,
    fsck_folder,
    holds_queue,
    postgres_queues,
    remove_folder,
    runner_locks_held,
)
from statequeue.store.urls import mask

if TYPE_CHECKING:
    from statequeue.core.views import QueueCheck, Status


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
    url = chosen_url(store)
    if url is not None:
        with Queue(name, home=home, store=url, create=False) as q:
            return q.fsck(repair=repair)
    return fsck_folder(queue_folder(name, home), repair=repair)


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
    masked). A damaged or broken local queue (one ``list_queues`` calls
    damaged) can be dropped too; an interrupted drop from a PostgreSQL store
    is finished by dropping again. Returns ``place``."""
    url = chosen_url(store)
    if url is not None:
        scratch = resolve_home(home) / ".postgres" / validate_queue_name(name)
        scratch_checked(scratch)  # an unsafe one stops the drop before it starts
        place = _drop_from_database(url, name, confirm)
        remove_scratch(scratch)
        return place
    folder = _idle_folder(name, home)
    refuse_foreign(folder)
    if confirm is not None:
        confirm(str(folder))
    remove_folder(folder)
    return str(folder)


def _drop_from_database(url: str, name: str, confirm: Callable[[str], None] | None) -> str:
    validate_queue_name(name)
    place = mask(url)
    if confirm is not None:
        confirm(place)
    # Not opened first (it would hold the queue): the drop itself refuses
    # while a runner is active, under the row lock runners register with.
    drop_postgres_queue(url, name)
    return place


def list_queues(
    home: str | os.PathLike[str] | None = None,
    *,
    store: str | None = None,
    on_unsafe: Callable[[UnsafeFolder], None] | None = None,
    on_damaged: Callable[[str, DamagedState], None] | None = None,
    on_no_access: Callable[[NoAccess], None] | None = None,
) -> list[Status]:
    """The status of every queue under ``home`` (or in the PostgreSQL store
    ``store``, whose scratch folders on this host are in ``home``), by name.
    An unsafe entry in the home (a link, another user's folder; a database
    queue's scratch folder) raises UnsafeFolder, or with ``on_unsafe`` is
    passed to it and left out; an unsafe home raises either way. A queue too
    damaged to open raises DamagedState, or with ``on_damaged`` is passed to
    it (with its name) and left out, so one damaged queue does not hide the
    others; one this user cannot read raises NoAccess, or is passed to
    ``on_no_access``."""
    url = chosen_url(store)
    if url is not None:
        # This host's claim locks (in the home) tell, as for `status`, the
        # items a dead runner's processes still run from the interrupted ones.
        return postgres_queues(url, resolve_home(home), on_unsafe=on_unsafe)
    root = resolve_home(home)
    # A folder whose journal is gone but whose archive remains is a damaged
    # queue (opening it refuses), never one to leave out silently.
    try:
        found_home = os.stat(root)
    except FileNotFoundError:
        return []  # no home yet: no queues (the command says the folder does not exist)
    except OSError:
        found_home = None  # not reachable (permission denied): check_home says why
    if found_home is not None and not stat.S_ISDIR(found_home.st_mode):
        raise UsageError(f"home {root} exists and is not a folder")  # as every other command
    check_home(root)  # an unsafe home is never skipped
    found = []
    for folder in sorted(root.iterdir()):
        try:
            if holds_queue(folder):
                with Queue(folder.name, home=root, create=False, store=None) as q:
                    found.append(q.status())
        except FolderAtFileName as exc:  # our own folder, broken: listed as damaged
            if on_damaged is None:
                raise
            on_damaged(folder.name, DamagedState(exc.message))
        except UnsafeFolder as exc:
            if on_unsafe is None:
                raise
            on_unsafe(exc)
        except DamagedState as exc:
            if on_damaged is None:
                raise
            on_damaged(folder.name, exc)
        except NoAccess as exc:
            if on_no_access is None:
                raise
            on_no_access(exc)
        except (OSError, UsageError) as exc:
            # Broken in a way opening does not call damage (its lock a folder,
            # its logs a file): still one queue's trouble, not the listing's.
            if on_damaged is None:
                raise
            what = exc.message if isinstance(exc, UsageError) else os_error_text(exc)
            on_damaged(folder.name, DamagedState(what))
    return found


def queues_place(
    home: str | os.PathLike[str] | None = None, *, store: str | None = None
) -> tuple[str, str]:
    """Where ``list_queues`` looks: ``("home", folder)`` or ``("store", masked URL)``."""
    url = chosen_url(store)
    if url is not None:
        return "store", mask(url)
    return "home", str(resolve_home(home))


def _idle_folder(name: str, home: str | os.PathLike[str] | None) -> Path:
    """The queue's folder, once no runner is active on it. A damaged queue
    (which cannot be opened) can still be dropped: its runner locks decide."""
    try:
        q = Queue(name, home=home, create=False, store=None)
    except DamagedState:
        return _idle_broken_folder(name, home)
    except (OSError, UsageError, FolderAtFileName) as exc:
        # Broken in a way opening does not call damage (its lock a folder, its
        # logs a file): `queues` lists it as damaged, so it drops as one does,
        # provided it is a queue's folder at all.
        if isinstance(exc, NoAccess) or not holds_queue(queue_folder(name, home)):
            raise
        return _idle_broken_folder(name, home)
    try:
        refuse_runners(name, q.store.active_runners())
        assert q.path is not None  # a journal store always has its folder
        return q.path
    finally:
        q.close()


def _idle_broken_folder(name: str, home: str | os.PathLike[str] | None) -> Path:
    """The folder of queue ``name``, which cannot be opened, once no runner
    holds its lock there (read without opening the journal)."""
    folder = queue_folder(name, home)
    if runner_locks_held(folder):
        raise RunnerActive(f"queue {name!r} has an active runner; stop it first")
    return folder
