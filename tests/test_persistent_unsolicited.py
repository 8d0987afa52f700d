"""Issue 23, a reply sent between two requests (unit level, real pipes, a stand-in
keeper): the next request's check finds it, so it is never taken as the next
item's answer; that worker is stopped and the item, which it never saw, goes
to a new worker (with a warning) -- it failed for the worker's mistake before.
The check is a poll of the reply pipe (no read, and no EAGAIN exception, when
nothing came: it runs once per item)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from statequeue.core.models import Claim
from statequeue.run.jobs import JobSpec
from statequeue.run.output_watch import OutputWatch
from statequeue.run.persistent import WorkerPool, WorkerSettings
from statequeue.store.memory import MemoryStore
from tests.test_persistent_attempt import StandInKeeper


def _first_item_answered(tmp_path: Path) -> tuple[WorkerPool, Any, OutputWatch]:
    spec = JobSpec(template=("worker",), queue="q", log_dir=tmp_path)
    pool = WorkerPool(spec, WorkerSettings(), 1)
    keeper: Any = StandInKeeper()
    watch = OutputWatch(MemoryStore())
    first = pool.attempt(Claim(1, "a", 1, "r"), keeper, 1)
    watch.started(first)
    _, _, stdin, reply = keeper.ends
    assert os.read(stdin, 1000) == b'{"id":1,"item":"a","attempt":1}\n'
    os.write(reply, b'{"id": 1, "ok": true}\n')
    for _ in range(100):
        if watch.wait(5.0) and first.exited():
            break
    watch.forget_output(first)
    assert first.finish().ok
    return pool, keeper, watch


def test_a_reply_sent_between_requests_sends_the_next_item_to_a_new_worker(
    tmp_path: Path,
) -> None:
    pool, keeper, watch = _first_item_answered(tmp_path)
    _, _, old_stdin, reply = keeper.ends
    os.write(reply, b'{"id": 2, "ok": true}\n')  # the next item's id, before its request
    second = pool.attempt(Claim(2, "b", 1, "r"), keeper, 1)
    assert second.bad == "" and second.reply is None and not second.exited()
    assert second.warnings == [
        "the worker of slot 1 sent a reply it was not asked for; "
        "it was stopped, and this item went to a new worker"
    ]
    # The old worker got no request (end of file: it was stopped); the new one got it.
    os.set_blocking(old_stdin, False)
    assert os.read(old_stdin, 1000) == b""
    _, _, new_stdin, _ = keeper.ends
    assert new_stdin != old_stdin
    assert os.read(new_stdin, 1000) == b'{"id":2,"item":"b","attempt":1}\n'
    watch.close()


def test_with_nothing_sent_between_requests_the_next_request_goes_out(tmp_path: Path) -> None:
    pool, keeper, watch = _first_item_answered(tmp_path)
    _, _, stdin, _ = keeper.ends
    second = pool.attempt(Claim(2, "b", 1, "r"), keeper, 1)
    assert second.bad == "" and not second.exited()
    assert os.read(stdin, 1000) == b'{"id":2,"item":"b","attempt":1}\n'
    watch.close()
