"""A run keeps no per-item record of items that are settled for good.

A `run --follow` can live for months and take millions of items: what it
keeps per item must not grow with them. Done is final (no later attempt moves
an item out of it), so the run counts done items instead of keeping their ids,
and it remembers the ids it took only when --limit needs them.
"""

from __future__ import annotations

from pathlib import Path

from statequeue.api.queue import Queue
from statequeue.run.options import RunOptions
from statequeue.run.runner import Runner

ITEMS = 120


def _run(queue: Queue, **options: object) -> Runner:
    runner = Runner(queue, RunOptions(command=("true",), jobs=2, **options))  # type: ignore[arg-type]
    runner.run()
    return runner


def test_a_run_counts_done_items_without_keeping_their_ids(sq_home: Path) -> None:
    queue = Queue("q", home=sq_home)
    queue.enqueue([f"item-{n}" for n in range(ITEMS)])
    runner = _run(queue)
    summary = runner.summary
    assert summary.succeeded == ITEMS and summary.attempts == ITEMS
    assert summary.text().startswith(f"items: {ITEMS} ok, 0 failed")
    # Nothing of the run grew by one entry per item taken.
    held = [summary.failed_for_good, summary.waiting, summary.handed_back, runner._taken]
    assert [len(s) for s in held] == [0, 0, 0, 0]
    assert not isinstance(summary.ok, set | frozenset | list | dict)


def test_with_limit_the_run_still_takes_only_its_own_items_again(sq_home: Path) -> None:
    # --limit is the one option that needs the ids taken (its scope: retries
    # of items this run took); there they are kept, at most --limit of them.
    queue = Queue("q", home=sq_home)
    queue.enqueue([f"item-{n}" for n in range(10)])
    runner = _run(queue, limit=4)
    assert runner.summary.succeeded == 4
    assert len(runner._taken) == 4
    assert queue.status().counts["pending"] == 6
