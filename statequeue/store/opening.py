"""Choosing and opening a queue's store: the local journal by its folder, or
PostgreSQL by URL. The one module above the backends that knows them: the
library reaches the journal's folder operations (check, list, remove) and the
database's by-name operations through here, never through their modules.

The backends' modules are imported when first used: ``import statequeue``
and the CLI's start-up load none of them, and a PostgreSQL queue never loads
the journal's (nor a local one psycopg).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from statequeue.core.errors import InvalidStoreUrl, UnsafeFolder, UsageError
from statequeue.store.base import Store
from statequeue.store.urls import ENV_STORE, is_store_url, mask

if TYPE_CHECKING:
    from statequeue.core.views import QueueCheck, Status


def chosen_url(store: str | None) -> str | None:
    """The store URL given (``--store``), else $STATEQUEUE_STORE; None: the local journal."""
    spec = store if store is not None else os.environ.get(ENV_STORE, "")
    return spec or None


def _check_driver(url: str) -> None:
    """InvalidStoreUrl unless ``url`` names a PostgreSQL store; UsageError
    unless psycopg (the ``postgres`` extra) is installed."""
    if not is_store_url(url):
        raise InvalidStoreUrl(
            f"invalid store URL {mask(url)!r}: expected postgresql://... or a libpq conninfo"
        )
    if not url.isascii():
        try:
            url.encode()
        except UnicodeEncodeError:  # a byte that is not UTF-8 (held as a surrogate escape)
            raise InvalidStoreUrl("invalid store URL: it is not UTF-8 text") from None
    try:
        import psycopg  # noqa: F401  # lazy: optional dependency psycopg; is it there?
    except ImportError as exc:
        raise UsageError(
            f"the PostgreSQL store needs psycopg ({exc.name} is missing): "
            "pip install 'statequeue[postgres]'"
        ) from None


def postgres_queues(
    url: str, home: Path | None = None, *, on_unsafe: Callable[[UnsafeFolder], None] | None = None
) -> list[Status]:
    """The status of every queue in the PostgreSQL database at ``url``, by
    name, each as its `status` says it on this host: with the claim locks in
    its scratch folder under ``home`` (HOME/.postgres/QUEUE) where there is
    one. A queue whose scratch folder is unsafe raises UnsafeFolder, or with
    ``on_unsafe`` is passed to it and left out (as a home's unsafe entry is)."""
    _check_driver(url)
    from statequeue.store.postgres.ops import statuses  # lazy: optional dependency psycopg

    return statuses(url, None if home is None else home / ".postgres", on_unsafe=on_unsafe)


def drop_postgres_queue(url: str, name: str) -> None:
    """Delete queue ``name`` from the PostgreSQL database at ``url`` (see ops.drop)."""
    _check_driver(url)
    from statequeue.store.postgres.ops import drop  # lazy: optional dependency psycopg

    drop(url, name)


def migrate_postgres(url: str) -> tuple[int, int]:
    """Create or upgrade the schema in the PostgreSQL database at ``url``
    (`statequeue db migrate`); returns (version before, version after)."""
    _check_driver(url)
    from statequeue.store.postgres.ops import migrate_schema  # lazy: optional dependency psycopg

    return migrate_schema(url)


def open_postgres(url: str, name: str, *, create: bool, scratch: Path) -> Store:
    """The PostgreSQL store at ``url`` for queue ``name`` (psycopg is imported only here)."""
    _check_driver(url)
    from statequeue.store.postgres import PostgresStore  # lazy: optional dependency psycopg

    # Logs of attempts running on this host are written in ``scratch``, then
    # stored in the database when the attempt ends; hidden from `queues` by
    # the leading dot. The store makes and checks it (0700, yours, no link).
    return PostgresStore(url, name, create=create, scratch=scratch)


# -- the local journal, by folder ----------------------------------------------


def open_journal(folder: Path, *, create: bool, auto_compact: int | None = None) -> Store:
    """The journal store of the local queue in ``folder`` (QueueNotFound
    unless ``create``; DamagedState for damage it cannot repair on open)."""
    from statequeue.store.journal.store import JournalStore  # lazy: start-up time

    return JournalStore(folder, create=create, auto_compact=auto_compact)


def fsck_folder(folder: Path, *, repair: bool) -> QueueCheck:
    """Check every record of the local queue in ``folder``, even one too
    damaged to open, and with ``repair`` salvage it (a ``FsckReport``)."""
    from statequeue.store.journal.fsck import fsck  # lazy: start-up time

    return fsck(folder, repair=repair)


def remove_folder(folder: Path) -> None:
    """Delete the queue folder ``folder`` and everything in it, never
    following a link (QueueNotFound when it is not there)."""
    from statequeue.store.journal.folder import remove_queue_folder  # lazy: start-up time
    from statequeue.store.journal.integrity import JOURNAL

    remove_queue_folder(folder, last=JOURNAL)


def check_nested_folder(home: Path, *names: str) -> None:
    """UnsafeFolder unless ``home/names...`` passes the checks a queue folder
    passes (no link, yours, 0700); what is missing is made."""
    from statequeue.store.journal.folder import QueueFolder  # lazy: start-up time

    QueueFolder.open_nested(home, *names).close()


def check_home(home: Path) -> None:
    """UnsafeFolder (or QueueNotFound when missing) unless the home folder
    passes the checks made when a queue in it opens."""
    from statequeue.store.journal.folder import open_home  # lazy: start-up time

    os.close(open_home(home, create=False))


def foreign_entries(folder: Path) -> list[str]:
    """The entries of queue folder ``folder`` statequeue did not make."""
    from statequeue.store.journal.integrity import foreign_entries as found  # lazy: start-up time

    return found(folder)


def holds_queue(folder: Path) -> bool:
    """Whether ``folder`` holds a local queue (its journal, or an archive left
    without one: a damaged queue); UnsafeFolder for a link or another user's."""
    from statequeue.store.journal.integrity import holds_queue as holds  # lazy: start-up time

    return holds(folder)


def runner_locks_held(folder: Path) -> bool:
    """Whether a runner holds its lock in the local queue ``folder``, read
    without opening the journal (for a queue too damaged to open)."""
    from statequeue.store.journal.locks import runner_locks_held as held  # lazy: start-up time

    return held(folder)
