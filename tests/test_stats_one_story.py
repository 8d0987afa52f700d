"""`stats` during a run tells one story: the item counts are read after the
attempts, so an item a runner finishes between the two reads is in both, and
the done items' durations never outnumber the done items (the outside tester
saw "729 done" in the headline and "durations of 759 done items" below it)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest

from statequeue.api.queue import Queue
from statequeue.cli.stats_view import duration_lines, headline
from statequeue.core.models import Outcome, RunnerInfo


def _finish_one(queue: Queue, runner: RunnerInfo) -> None:
    claim = queue.claim(runner)
    assert claim is not None
    queue.store.finish(claim, Outcome(ok=True, duration=0.25, exit_code=0))


@pytest.mark.parametrize("since", [None, 3600.0], ids=["summary", "since"])
def test_an_item_finished_between_the_reads_is_counted_in_both(
    monkeypatch: pytest.MonkeyPatch, since: float | None
) -> None:
    with Queue("s") as queue:
        queue.enqueue(["a", "b", "c", "d"])
        runner = RunnerInfo("r", os.getpid(), "h", "", time.time())
        queue.register_runner(runner)
        _finish_one(queue, runner)
        _finish_one(queue, runner)
        store = queue.store
        name = "stats_summary" if since is None else "iter_attempt_batches"
        read: Callable[..., Any] = getattr(store, name)

        def meanwhile(*args: Any) -> Any:
            monkeypatch.setattr(store, name, read)  # once
            _finish_one(queue, runner)  # a runner finishes item c between the reads
            return read(*args)

        monkeypatch.setattr(store, name, meanwhile)
        figures = queue.stats(since)
    assert figures.durations.count == figures.counts["done"] == 3
    assert figures.attempts == 3 and figures.left == 1
    text = "\n".join([headline(figures), *duration_lines(figures)])
    assert "3 done" in text and "durations of 3 done items" in text, text
