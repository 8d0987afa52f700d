"""Which pending items a leftover of an earlier attempt keeps from a run.

Read from the notes runs' keepers keep in ``runners/`` while they hold
claims for detached processes that outlived their run
(core/leftover_note.py). A note whose lock is free is stale (its keeper
died): it is removed, and says nothing.
"""

from __future__ import annotations

import os
from collections.abc import Collection

from statequeue.core.errors import StateQueueError
from statequeue.core.leftover_note import SUFFIX, read_note
from statequeue.store.journal.claims import ClaimLocks
from statequeue.store.journal.folder import QueueFolder
from statequeue.store.journal.locks import lock_is_free, unlink_if_free
from statequeue.store.records.items import P_CODE
from statequeue.store.records.state import QueueState

RUNNERS = "runners"
NOTE_BYTES = 65536  # a note names the few items a run's leftovers hold


def held_by_leftovers(
    folder: QueueFolder, state: QueueState, claims: ClaimLocks, among: Collection[int] | None
) -> dict[int, tuple[int, ...]]:
    """The pending items (of ``among``) whose claim is held and that a live
    keeper's note names, each with the noted pids still alive."""
    held = {}
    codes = state.codes
    for item, pids in noted(folder).items():
        if among is not None and item not in among:
            continue
        if 0 < item < len(codes) and codes[item] == P_CODE and not claims.free(item):
            held[item] = tuple(pid for pid in pids if _alive(pid))
    return held


def noted(folder: QueueFolder) -> dict[int, tuple[int, ...]]:
    """Every item the live keepers' notes name, with its pids."""
    found: dict[int, tuple[int, ...]] = {}
    try:
        names = [n for n in folder.names(RUNNERS) if n.endswith(SUFFIX)]
    except (OSError, StateQueueError):
        return found
    for name in names:
        try:
            if lock_is_free(folder, RUNNERS, name):
                unlink_if_free(folder, RUNNERS, name)  # its keeper died
                continue
            fd = folder.open_file(name, os.O_RDONLY, sub=RUNNERS)
        except (OSError, StateQueueError):
            continue
        try:
            data = os.read(fd, NOTE_BYTES)
        except OSError:
            continue
        finally:
            os.close(fd)
        for item, pids in read_note(data).items():
            found[item] = tuple(sorted({*found.get(item, ()), *pids}))
    return found


def _alive(pid: int) -> bool:
    if pid <= 0:  # not one process (kill would signal a group)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's: alive
    return True
