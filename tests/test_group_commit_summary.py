"""A run counts a result in its summary only once the fsync that covers it
succeeded (group commit).

Several children that end together are recorded as one group: every end
record but the last is written without an fsync, and the last one's fsync
covers them all. Before, each was counted "ok" as soon as it was written: a
run stopped by that last fsync failing (exit 6) then said "1 ok" for an item
whose result may never have reached the disk. Now such an item is counted
once the fsync succeeded, and is named cut short when it never did.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from statequeue.api.queue import Queue
from statequeue.core.errors import DurabilityError
from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, Outcome
from statequeue.run.events import RunSummary
from statequeue.run.options import RunOptions
from statequeue.run.recorder import ResultRecorder

OK = Outcome(ok=True, exit_code=0)


def _recorder(q: Queue) -> tuple[ResultRecorder, list[Any]]:
    runner = new_runner(("true",))
    q.register_runner(runner)
    events: list[Any] = []
    recorder = ResultRecorder(
        q,
        RunOptions(command=("true",), jobs=2),
        runner,
        RunSummary(),
        events.append,
        fuse_scope=lambda: (False, None),
        on_halt=lambda: None,
    )
    for _ in range(2):
        claim = q.claim(runner)
        assert claim is not None
        job = SimpleNamespace(claim=claim, log_path=None, lease_kill_at=None)
        recorder.unrecorded.append((job, OK))  # type: ignore[arg-type]  # what record() reads
    return recorder, events


def test_a_result_whose_covering_fsync_failed_is_not_counted_ok(
    sq_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Queue("group", home=sq_home) as q:
        q.enqueue(["a", "b"])
        recorder, _ = _recorder(q)
        finish = q.finish

        def failing_fsync(claim: Any, outcome: Outcome, **kw: Any) -> ItemState:
            if kw.get("sync", True):
                raise DurabilityError("fsync of the journal failed: EIO")
            return finish(claim, outcome, **kw)

        monkeypatch.setattr(q, "finish", failing_fsync)
        with pytest.raises(DurabilityError):
            recorder.record_owed()
        assert recorder.summary.ok == 0
        assert [(i, s) for i, s, _ in recorder.unsynced] == [(1, ItemState.DONE)]
        assert recorder.ready == []  # nothing reported either


def test_a_group_is_counted_once_its_fsync_succeeded(sq_home: Path) -> None:
    with Queue("group", home=sq_home) as q:
        q.enqueue(["a", "b"])
        recorder, _ = _recorder(q)
        recorder.record_owed()
        assert recorder.summary.ok == 2
        assert recorder.unsynced == []
        assert len(recorder.ready) == 2
        assert {v.state for v in q.items()} == {ItemState.DONE}
