"""The stats cache's compaction hook under kills: a compaction killed at any
step (its durable operations, the caches' renames, either side of the hook)
never leaves a cache that gives other figures than the files do."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from statequeue.api.queue import Queue
from statequeue.store.journal import stats_cache
from tests.faults.test_compaction_online import ROOT, build
from tests.test_stats_cache import NOW, _rounded


def _figures(home: Path, monkeypatch: pytest.MonkeyPatch, *, cached: bool) -> object:
    with monkeypatch.context() as m:
        m.setenv("STATEQUEUE_HOME", str(home))
        if not cached:
            m.setenv("STATEQUEUE_CHECKPOINT_EVERY", "0")
        q = Queue("q", create=False)
        try:
            return _rounded(q.stats(now=NOW).to_json())
        finally:
            q.close()


@pytest.mark.parametrize(
    "warm", [True, pytest.param(False, marks=pytest.mark.crash)], ids=["warm", "cold"]
)
def test_a_killed_compaction_never_leaves_wrong_stats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warm: bool
) -> None:
    template = tmp_path / "template" / "q"
    template.parent.mkdir()
    build(template)
    if warm:  # a cache of the queue as it is: the hook extends it
        _figures(template.parent, monkeypatch, cached=True)
        assert (template / stats_cache.NAME).exists()
    steps, hook = _compact(template.parent, 0).stdout.split()
    unkilled = tmp_path / "unkilled"
    assert (unkilled / "q" / stats_cache.NAME).exists()
    assert _figures(unkilled, monkeypatch, cached=True) == _figures(
        unkilled, monkeypatch, cached=False
    )
    # Every step in `make test-crash`; from the hook on (the renames of the
    # journal and the caches among them) in `make test`.
    first = int(hook) if warm else 1
    for k in range(first, int(steps) + 1):
        home = tmp_path / f"k{k}"
        shutil.copytree(template.parent, home)
        done = _compact(home, k)
        assert done.returncode == -signal.SIGKILL, done.stderr
        cached = _figures(home, monkeypatch, cached=True)
        assert cached == _figures(home, monkeypatch, cached=False), f"killed at step {k}"
    assert int(steps) - int(hook) >= 4  # the hook, the journal's rename, the caches' renames


def _compact(home: Path, k: int) -> subprocess.CompletedProcess[str]:
    """Compact a copy of the queue (``home`` itself when ``k`` is 0)."""
    if k == 0:
        home = home.parent / "unkilled"
        shutil.copytree(home.parent / "template", home)
    done = subprocess.run(
        [sys.executable, "-m", "tests.faults.stats_compactor", str(home / "q"), str(k)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert k or done.returncode == 0, done.stderr
    return done
