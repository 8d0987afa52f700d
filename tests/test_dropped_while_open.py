"""A queue dropped by another process while a `Queue` (or a CLI watcher) has
it open: its next use raises QueueNotFound (exit 7) saying it was dropped,
never a raw FileNotFoundError (exit 6 in the CLI)."""

from __future__ import annotations

import io
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from statequeue import Queue
from statequeue.core.errors import QueueNotFound
from tests.conftest import STATEQUEUE

USES: dict[str, Callable[[Queue], object]] = {
    "enqueue": lambda q: q.enqueue(["c"]),
    "work": lambda q: next(iter(q.work())),
    "status": lambda q: q.status(),
    "stats": lambda q: q.stats(),
    "history": lambda q: q.history(1),
    "retry": lambda q: q.retry([1]),
    "events": lambda q: next(q.event_batches(follow=False)),
    "export": lambda q: q.export(io.BytesIO()),
    "read_log": lambda q: q.read_log(1, 1),
}


def _drop(name: str, sq_env: dict[str, str]) -> None:
    """`statequeue drop NAME --yes` in another process, as the user would."""
    subprocess.run([STATEQUEUE, "drop", name, "--yes"], env=sq_env, check=True, capture_output=True)


@pytest.mark.parametrize("use", list(USES))
@pytest.mark.parametrize("made_again", [False, True], ids=["gone", "made-again"])
def test_a_queue_dropped_by_another_process_raises_queue_not_found(
    sq_home: Path, sq_env: dict[str, str], use: str, made_again: bool
) -> None:
    queue = Queue("q", home=sq_home)
    queue.enqueue(["a", "b"])
    for item in queue.work():
        item.done()
        break
    _drop("q", sq_env)
    if made_again:  # a new queue of the same name is not the one this Queue had
        Queue("q", home=sq_home).close()
    with pytest.raises(QueueNotFound, match=r"^queue 'q' was dropped: its folder .* was removed"):
        USES[use](queue)
    queue.close()  # closing what was dropped is quiet
