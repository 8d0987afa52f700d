"""The automatic compaction child: ``python -m statequeue.store.journal.compaction_child
FOLDER`` compacts the queue in FOLDER unless a compaction runs already.

Started by ``background_compaction.BackgroundCompaction``, so that no runner
waits for the slow part of a compaction; a module of its own because it opens
the queue as a store, which starts it.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from statequeue.core.errors import StateQueueError
from statequeue.store.journal.store import JournalStore


def main(argv: list[str]) -> int:
    """Compact the queue in folder ``argv[1]`` unless a compaction runs."""
    # Housekeeping the user did not ask for: a Ctrl-C meant for the runner
    # should not cut it short (it would be safe, only wasted).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        store = JournalStore(Path(argv[1]), create=False, auto_compact=0)
        try:
            store.compact_if_free()
        finally:
            store.close()
    except StateQueueError as exc:
        print(f"statequeue: {exc.message}", file=sys.stderr)
        return int(exc.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
