"""The host of an attempt recovered after its runner was recorded lost
(issue 21, point 9): `stats` from stats.ckpt and from the files agree.

The race, written in its order: runner R (host-r) dies during item 1 while a
leftover of the item (here: a copy of its claim fd) keeps the claim; another
process records R as lost (a ``stop`` record; R leaves the state); the queue
is compacted (R's ``run`` record is not carried over, the cache is staged);
the claim is let go and the item recovered, by a process that no longer
knows R's host. The cache used to name host-r (it remembered R's ``run``
record) while the files gave "". Both now take a record that names its runner
as written: host "" here, since the recovery no longer knew R's host.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from statequeue.api.queue import Queue
from statequeue.core.models import OnInterrupted, Outcome, RunnerInfo
from tests.test_stats_cache import _figures, _uncached


def _runner(name: str, host: str) -> RunnerInfo:
    return RunnerInfo(name, os.getpid(), host, "", time.time())


def _hosts(figures: dict[str, Any]) -> list[Any]:
    return [(r["runner"], r["host"]) for r in figures["runners"]]


def test_a_recovery_after_the_runner_was_recorded_lost_gives_one_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    q = Queue("race")
    q.enqueue(["a", "b"])
    dying = Queue("race")
    lost = _runner("runner-r", "host-r")
    dying.store.register_runner(lost)
    claim = dying.store.claim(lost)
    assert claim is not None and claim.item_id == 1
    leftover = os.dup(claim.inherit_fds[0])  # the claim outlives its runner
    try:
        dying.close()  # R dies: its runner lock goes, the claim stays
        report = q.store.recover(on_interrupted=OnInterrupted.RETRY)
        assert report.retried == []  # R recorded lost, its item still claimed
        other = _runner("runner-o", "host-o")
        q.store.register_runner(other)
        done = q.store.claim(other)
        assert done is not None and done.item_id == 2
        q.store.finish(done, Outcome(ok=True, exit_code=0, duration=1.0))
        q.compact()  # stages the cache; R's `run` record stays behind
    finally:
        os.close(leftover)
    report = q.store.recover(on_interrupted=OnInterrupted.RETRY)
    assert report.retried == [1]
    cached, files = _figures(q), _uncached("race", monkeypatch)
    assert _hosts(cached) == _hosts(files) == [("runner-o", "host-o"), ("runner-r", "")]
    assert cached == files
    q.close()
