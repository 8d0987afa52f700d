"""A PostgreSQL queue's scratch folder on this host: ``HOME/.postgres/QUEUE``.

It holds the logs of attempts running here (``logs``: stored in the database
when each attempt ends) and the claim lock files of the same-host recovery
shortcut (``claims``). Both matter as much as a local queue's: another user
who made them first, in a shared home, could read the jobs' output through a
planted log file, or hang a runner by holding flocks on its claim files. So
they are checked exactly as a local queue's folders are (folder.py): the
home as a home, and ``.postgres``, the queue's folder, ``logs`` and
``claims`` made 0700 if missing, owned by the user (or root), not writable by
group or others, never reached through a link; otherwise UnsafeFolder (exit 9).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from statequeue.store.journal.folder import QueueFolder
from statequeue.store.postgres import logs, reaping


def open_scratch(scratch: Path) -> QueueFolder:
    """``scratch`` (HOME/.postgres/QUEUE) opened and checked, with its subfolders."""
    folder = QueueFolder.open_nested(scratch.parents[1], scratch.parent.name, scratch.name)
    try:
        # All checked now, so that an unsafe one stops any command at once,
        # not a runner with an item claimed.
        for sub in (logs.SUBFOLDER, reaping.SUBFOLDER):
            folder.subfolder(sub, create=True)
    except BaseException:
        folder.close()
        raise
    return folder


def remove_if_unused(folder: QueueFolder, made_above: Sequence[Path] = ()) -> None:
    """Remove ``folder`` and its two subfolders if they are empty: made by an
    open that then found no such queue (`status` of a missing or dropped
    queue must not leave its folders behind), and then ``made_above`` (the
    home and its .postgres where that open made them), innermost first.
    Anything in them keeps them."""
    with contextlib.suppress(OSError):
        for sub in (logs.SUBFOLDER, reaping.SUBFOLDER):
            os.rmdir(sub, dir_fd=folder.fd)
        os.rmdir(folder.path)
        for parent in reversed(made_above):
            os.rmdir(parent)
