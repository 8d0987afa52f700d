"""A compacting process for tests/faults/test_stats_cache_crash.py.

``python -m tests.faults.stats_compactor FOLDER K`` compacts the queue in
FOLDER and SIGKILLs itself at its K-th step (0: never): each durable
operation of the compaction (write, fsync, truncate, rename, folder fsync,
as ``online_compactor`` counts them, with the same concurrent work), each
rename of a cache into place, and just before and after the stats cache's
compaction hook stages its summary. Unkilled, it prints how many steps
there were and the number of the step before the hook.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from statequeue.store.journal import stats_cache
from statequeue.store.journal.store import JournalStore
from tests.faults.online_compactor import KillAt


def main(argv: list[str]) -> int:
    folder, k = Path(argv[1]), int(argv[2])
    ops = KillAt(k, folder)
    real_stage, real_replace = stats_cache.stage, os.replace

    hook_at = []

    def stage(*args: Any, **kw: Any) -> None:
        hook_at.append(ops.count + 1)
        ops._hit()
        real_stage(*args, **kw)
        ops._hit()

    def replace(*args: Any, **kw: Any) -> None:
        ops._hit()
        real_replace(*args, **kw)

    stats_cache.stage = stage  # type: ignore[assignment]  # the hook, as compaction calls it
    os.replace = replace  # type: ignore[assignment]  # the caches' renames into place
    store = JournalStore(folder, create=False, ops=ops, auto_compact=0)
    try:
        store.compact()
    finally:
        store.close()
    print(ops.count, *hook_at)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
