"""Automatic compaction in a child process, so that no runner waits for it.

A runner notices that dead records piled up while it records a result (under
the queue lock) and starts ``python -m statequeue.store.journal.compaction_child
FOLDER``; the child compacts online (``online_compaction``), holding the queue
lock only at the two ends. A separate process rather than a thread: a thread
would share the runner's interpreter lock and stall its loop for the whole
slow part. The child holds no claim and no runner lock: killing it at any
moment leaves the old files or the new ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from statequeue.core import child_exits
from statequeue.store.journal.compaction_files import compaction_lock
from statequeue.store.journal.settings import compaction_due

if TYPE_CHECKING:
    from statequeue.store.journal.folder import QueueFolder
    from statequeue.store.records.state import QueueState

CHILD = "statequeue.store.journal.compaction_child"  # the module the child runs

# Started with -P, not -m alone: `-m` put the working directory first on its
# import path, and a file there named like a module it imports (orjson.py,
# or a standard one) ran in it (an outside tester's hostile folder). -P drops
# only that: PYTHONPATH and the user site, where statequeue or its
# dependencies may live, stay as this process has them (-I dropped them, and
# the child failed silently). statequeue's own folder, as this process
# imported it (links kept), is appended in case only the working directory
# held it: after the standard library and everything else.
_CHILD_CODE = (
    "import sys; sys.path.append(sys.argv[1]); "
    f"from {CHILD} import main; sys.exit(main(sys.argv[1:]))"
)
_HOME = str(Path(os.path.abspath(__file__)).parents[3])  # as imported: links kept


class BackgroundCompaction:
    """The one compaction child a store may have running at a time."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.gave_up = False  # a child failed: not started again by this store
        self.started = 0  # for tests and the benchmark

    def start_if_due(
        self,
        folder: QueueFolder,
        state: QueueState,
        *,
        lines: int,
        limit: int,
        before: Callable[[], None],
    ) -> str | None:
        """``start``, if dead records in the journal (``lines`` long, of
        ``state``) reach ``limit`` (0: never) and outnumber the live ones."""
        # It runs in a child process that holds the queue lock only briefly,
        # so the runners carry on meanwhile (``online_compaction``).
        if compaction_due(lines, state.live_count(), len(state.runners), limit):
            return self.start(folder, before=before)
        return None

    def start(self, folder: QueueFolder, *, before: Callable[[], None]) -> str | None:
        """Start a compaction child unless one runs (ours, or any process's:
        ``compact.lock`` is held), calling ``before`` just before. Returns a
        notice if the last child failed."""
        if self.gave_up or self.running():
            return None
        notice = self._reap()
        if notice:
            self.gave_up = True  # the same cause would fail it again; `compact` says why
            return notice
        with compaction_lock(folder, wait=None) as free:
            if not free:
                return None
        before()
        self.child = subprocess.Popen(
            [sys.executable, "-P", "-c", _CHILD_CODE, _HOME, str(folder.path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,  # never the claims or runner locks: they must die with us
        )
        child_exits.expect(self.child.pid)  # the runner's keeper: no item's process
        self.started += 1
        return None

    def running(self) -> bool:
        return self.child is not None and self.child.poll() is None

    def wait(self) -> None:
        """Wait for the child (the runner is closing: leave no compaction behind)."""
        if self.child is not None:
            self.child.wait()

    def _reap(self) -> str | None:
        child, self.child = self.child, None
        if child is None:
            return None
        # Reaped by the runner (a subreaper that reaps all its children):
        # Popen saw ECHILD and says 0; the real code was kept for us.
        code = child_exits.take(child.pid)
        if code is not None:
            child.returncode = code
        if child.returncode == 0:
            return None
        return (
            f"automatic compaction failed (exit {child.returncode}); the queue is unchanged: "
            "run `statequeue compact` to see why"
        )
