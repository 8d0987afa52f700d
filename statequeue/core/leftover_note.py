"""The note a run's keeper keeps while it holds claims for leftovers.

A detached process an item's attempt left behind (a new session, its
environment wiped, so nothing marks it as the item's) keeps that item's
claim held after its run has ended: the run's keeper holds it until the
process is gone, so nothing of the item runs twice (promise 4). A later run
then waits for the claim; without a word it looks hung. So while it holds
such claims the keeper writes which processes it waits for, one JSON line::

    {"keeper": 4321, "items": {"7": [1234, 1240]}}

in a file of its own in the queue's ``runners`` folder, flock'd by the keeper
for as long as the file is meant (a note whose lock is free is stale: its
keeper died), rewritten when what it waits for changes, removed when it
holds nothing more. The waiting run, and ``status``, read it (the journal
store's ``held_by_leftovers``).

Standard library only: the keeper (run/keeper_process.py) imports this module
from its folder as a script under ``python -I -S``.
"""

from __future__ import annotations

import os

SUFFIX = ".leftovers"
"""A note's name: the run's runner id, then this."""


def note_name(runner_id: str) -> str:
    """The name of runner ``runner_id``'s note in the ``runners`` folder."""
    return f"{runner_id}{SUFFIX}"


class LeftoverNote:
    """The keeper's side: its note in the folder of ``folder_fd``, named ``name``."""

    def __init__(self, folder_fd: int, name: str) -> None:
        self.folder_fd = folder_fd
        self.name = name
        self.fd = -1
        self.said: dict[int, list[int]] = {}

    def write(self, held: dict[int, list[int]], owners: dict[int, frozenset[int]]) -> None:
        """Note the items of ``held`` (item -> claim fds) with the pids that
        ``owners`` (pid -> the items it may be of) attributes to each; the
        note goes once nothing is held. Never raises: a hint for a person
        must not stop the keeper that keeps promise 4."""
        items = {
            item: sorted(pid for pid, of in owners.items() if item in of) for item in sorted(held)
        }
        if items == self.said:
            return
        try:
            if not items:
                self.remove()
            else:
                self._put(items)
        except OSError:
            return
        self.said = items

    def _put(self, items: dict[int, list[int]]) -> None:
        import json  # lazy: start-up time (the keeper imports it only for a note)

        line = json.dumps({"keeper": os.getpid(), "items": items}, separators=(",", ":"))
        data = line.encode("ascii") + b"\n"
        if self.fd < 0:
            self._create(data)
            return
        # No fsync: a hint for a person, meant only while this process lives
        # (a reboot ends the leftovers it names). A reader that comes between
        # the write and the truncate reads up to the newline.
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))

    def _create(self, data: bytes) -> None:
        """Make the note under a name of its own, locked and written, then
        rename it into place: a reader never finds the note unlocked (it would
        take it for a dead keeper's and remove it, and the keeper, thinking
        it said so, would not write it again)."""
        import fcntl  # lazy: start-up time (the keeper imports it only for a note)

        temp = f".{self.name}.{os.getpid()}.tmp"
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, 0o600, dir_fd=self.folder_fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: the note is meant
            os.pwrite(fd, data, 0)
            os.rename(temp, self.name, src_dir_fd=self.folder_fd, dst_dir_fd=self.folder_fd)
            os.fsync(self.folder_fd)  # the new name, as after any create or rename
        except OSError:
            os.close(fd)
            try:  # noqa: SIM105  # not contextlib.suppress: the keeper runs under -I -S
                os.unlink(temp, dir_fd=self.folder_fd)
            except OSError:
                pass
            raise
        self.fd = fd

    def remove(self) -> None:
        """Remove the note (unlinked before its lock goes: a reader never
        takes a note being removed for a stale one of a dead keeper)."""
        if self.fd < 0:
            return
        fd, self.fd = self.fd, -1
        self.said = {}
        try:
            os.unlink(self.name, dir_fd=self.folder_fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Remove the note, and let its folder go."""
        try:  # noqa: SIM105  # not contextlib.suppress: ~3 ms of the keeper's start (-I -S)
            self.remove()
        except OSError:
            pass
        os.close(self.folder_fd)


def read_note(data: bytes) -> dict[int, tuple[int, ...]]:
    """The items a note names, each with its pids ({} for a note that is
    empty, torn or not one)."""
    import json  # lazy: start-up time (read only while a run waits, or by status)

    try:
        found = json.loads(data.partition(b"\n")[0])
        items = found["items"]
        return {int(item): tuple(int(pid) for pid in pids) for item, pids in items.items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        return {}
