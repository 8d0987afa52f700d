"""A process SIGKILLed inside the stats cache refresh that follows its state
checkpoints (store/stats_refresh.py): as the refresh reads, after it wrote
its temp file, and after the rename. Whatever it left, `stats` gives the
figures the files give, and the next writer to open the queue removes the
temp file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from statequeue.store.journal import stats_cache
from statequeue.store.journal.store import JournalStore
from tests.faults.test_compaction_online import ROOT
from tests.faults.test_stats_cache_crash import _figures


@pytest.mark.parametrize("where", ["fold", "write", "renamed"])
@pytest.mark.parametrize("nth", [1, 3])
def test_a_kill_inside_the_refresh_never_leaves_wrong_stats(
    sq_home: Path, monkeypatch: pytest.MonkeyPatch, where: str, nth: int
) -> None:
    folder = sq_home / "q"
    store = JournalStore(folder, create=True, auto_compact=0)
    store.enqueue([f"item-{i}" for i in range(200)])
    store.close()
    env = {**os.environ, "STATEQUEUE_CHECKPOINT_EVERY": "40"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.faults.stats_refresher", str(folder), where, str(nth)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    if where == "write":  # killed between the temp file and its rename
        assert [n for n in os.listdir(folder) if n.startswith(f".{stats_cache.NAME}.")]
    if where == "renamed" or nth > 1:
        assert (folder / stats_cache.NAME).exists()  # an earlier or this refresh's cache
    monkeypatch.setenv("STATEQUEUE_CHECKPOINT_EVERY", "40")
    cached = _figures(sq_home, monkeypatch, cached=True)
    assert cached == _figures(sq_home, monkeypatch, cached=False)
    assert not [n for n in os.listdir(folder) if n.startswith(f".{stats_cache.NAME}.")]
