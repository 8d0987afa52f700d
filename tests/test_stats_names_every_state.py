"""`stats` names the failure examples by their text whatever their state now:
it looked the text up through the item's result, so an example that was
pending, running or cancelled again showed as a bare id (`e.g. #2 (attempt 1)`)."""

from __future__ import annotations

import os
import subprocess
import time

from statequeue.api.queue import Queue
from statequeue.cli.stats_names import stats_names
from statequeue.core.models import ItemState, RunnerInfo
from tests.conftest import STATEQUEUE


def test_stats_names_examples_in_every_state(sq_env: dict[str, str], store_url: str) -> None:
    texts = {1: "runs-again", 2: "waits-again", 3: "was-cancelled", 4: "still-failed"}
    with Queue("n", store=store_url or None) as queue:
        queue.enqueue(list(texts.values()))
        for item in queue.work():
            item.fail(f"{item.item} broke")  # one reason each: each is an example
        queue.retry([1])
        runner = RunnerInfo("alive", os.getpid(), "h", "", time.time())
        queue.register_runner(runner)
        claim = queue.claim(runner)
        assert claim is not None and claim.item_id == 1
        queue.retry([2, 3])
        queue.cancel([3])
        assert queue.states(list(texts)) == {
            1: ItemState.RUNNING,
            2: ItemState.PENDING,
            3: ItemState.CANCELLED,
            4: ItemState.FAILED,
        }
        figures = queue.stats()
        assert {g.example_id for g in figures.reasons} == set(texts)
        assert stats_names(queue, figures).items == texts
        store = ["--store", store_url] if store_url else []
        out = subprocess.run(
            [STATEQUEUE, *store, "-q", "n", "stats"], env=sq_env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        for item_id, text in texts.items():
            assert f"e.g. #{item_id} {text} (attempt 1)" in out.stdout, out.stdout
