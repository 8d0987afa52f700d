"""Issue 27: a result is printed once the next child is started, in the same order.

The runner reports a durable result after it has started the next item's
child (Runner._emit, recorder.ready), so printing is off the path from one
child's exit to the next start. What the user sees must not change: each
item's result comes before the next item's start, every result is reported by
the end of the run, and a notice never jumps ahead of a result."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from statequeue.api.queue import Queue
from statequeue.run.events import ItemFinished, ItemStarted, Notice, RunEvent
from statequeue.run.jobs import Job
from statequeue.run.options import RunOptions
from statequeue.run.runner import Runner


def _seen(event: RunEvent) -> str:
    if isinstance(event, ItemStarted):
        return f"start {event.claim.item}"
    if isinstance(event, ItemFinished):
        return f"end {event.claim.item}"
    return f"notice {event.text}"


def _into(seen: list[str]) -> Callable[[RunEvent], None]:
    return lambda event: seen.append(_seen(event))


def test_events_keep_their_order_and_all_come_by_the_end(sq_home: Path) -> None:
    seen: list[str] = []
    with Queue("q", home=sq_home) as q:
        q.enqueue(["a", "b", "c"])
        summary = Runner(
            q, RunOptions(command=("true",)), on_event=lambda e: seen.append(_seen(e))
        ).run()
    assert summary.attempts == 3
    assert seen == ["start a", "end a", "start b", "end b", "start c", "end c"]


def test_the_next_child_starts_before_the_last_result_is_reported(
    sq_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []
    spawn = Job._spawn

    def spawned(self: Job) -> int:
        order.append(f"spawn {self.claim.item}")
        return spawn(self)

    monkeypatch.setattr(Job, "_spawn", spawned)
    with Queue("q", home=sq_home) as q:
        q.enqueue(["a", "b"])
        runner = Runner(q, RunOptions(command=("true",)), on_event=_into(order))
        runner.run()
    # b's child was started before a's result was reported (a's record was
    # durable before b was claimed: the fused finish_and_claim).
    assert order == ["spawn a", "start a", "spawn b", "end a", "start b", "end b"]


def test_a_notice_after_a_result_comes_after_it(sq_home: Path) -> None:
    seen: list[str] = []
    with Queue("q", home=sq_home) as q:
        q.enqueue(["a", "b"])
        runner = Runner(q, RunOptions(command=("true",)), on_event=_into(seen))
        record_batch = runner.recorder.record_batch

        def then_a_notice(*args: object, **kwargs: object) -> None:
            record_batch(*args, **kwargs)  # type: ignore[arg-type]
            runner.on_event(Notice("after the result"))

        runner.recorder.record_batch = then_a_notice  # type: ignore[method-assign]
        runner.run()
    assert seen.index("end a") < seen.index("notice after the result") < seen.index("start b")
