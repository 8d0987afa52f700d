"""A process that runs items and is SIGKILLed inside its stats cache refresh,
for tests/faults/test_stats_refresh_kill.py.

``python -m tests.faults.stats_refresher FOLDER WHERE N`` runs a queue's
items in-process (claim, finish; a state checkpoint every 40 records, so the
stats cache refresh thread runs several times) and SIGKILLs itself the N-th
time the refresh reaches WHERE:

- ``fold``: as it starts reading the records after the cache;
- ``write``: after the temp file is written, before its rename into place;
- ``renamed``: just after the rename.

Exits 3 if it ran out of items before the kill.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from statequeue.core.models import Outcome, RunnerInfo
from statequeue.store.journal import cache_file, stats_cache
from statequeue.store.journal.store import JournalStore

THREAD = "statequeue-stats"


def _in_refresh() -> bool:
    return threading.current_thread().name == THREAD


def main(argv: list[str]) -> int:
    folder, where, n = Path(argv[1]), argv[2], int(argv[3])
    hits = 0

    def hit() -> None:
        nonlocal hits
        hits += 1
        if hits == n:
            os.kill(os.getpid(), signal.SIGKILL)

    real_fold, real_replace = stats_cache.fold, os.replace

    def fold(*args: Any, **kw: Any) -> bool:
        if where == "fold" and _in_refresh():
            hit()
        return real_fold(*args, **kw)

    def replace(*args: Any, **kw: Any) -> None:
        if where == "write" and _in_refresh():
            hit()
        real_replace(*args, **kw)
        if where == "renamed" and _in_refresh():
            hit()

    stats_cache.fold = fold  # type: ignore[assignment]
    cache_file.os.replace = replace  # type: ignore[assignment]  # the cache's rename
    rng = random.Random(n)
    store = JournalStore(folder, create=False, auto_compact=0)
    runner = RunnerInfo("refresher", os.getpid(), "host-r", "", time.time())
    store.register_runner(runner)
    while (claim := store.claim(runner)) is not None:
        ok = rng.random() > 0.25
        duration = round(rng.uniform(0.01, 5), 3)
        store.finish(claim, Outcome(ok=ok, exit_code=0 if ok else 2, duration=duration))
    store.close()
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv))
