"""`stats` gives no ETA while the queue is paused, as `status` says: it used to
give one from the rate of the run before the pause (`stats --json`:
"eta": {"seconds": 9.68}) while `status` said "ETA paused"."""

from __future__ import annotations

import os
import subprocess
import time

from statequeue.api.queue import Queue
from statequeue.core.models import RunnerInfo
from tests.conftest import STATEQUEUE


def test_stats_gives_no_eta_while_paused(sq_env: dict[str, str], store_url: str) -> None:
    store = ["--store", store_url] if store_url else []
    with Queue("p", store=store_url or None) as queue:
        queue.enqueue(["a", "b", "c", "d", "e"])
        for n, item in enumerate(queue.work(), 1):
            item.done()
            if n == 2:
                break
        # A runner is still active (so only the pause can stop the ETA).
        queue.register_runner(RunnerInfo("alive", os.getpid(), "h", "", time.time()))
        queue.pause()
        figures = queue.stats()
        assert figures.rate and figures.left == 3 and figures.runner_active is True
        assert figures.eta is None and figures.paused is True
        assert figures.to_json()["eta"] == {
            "left": 3,
            "seconds": None,
            "runner_active": True,
            "paused": True,
        }
        run = [STATEQUEUE, *store, "-q", "p"]
        text = subprocess.run([*run, "stats"], env=sq_env, capture_output=True, text=True)
        assert text.returncode == 0, text.stderr
        (rate,) = [line for line in text.stdout.splitlines() if line.startswith("rate:")]
        assert rate.endswith("; ETA paused (3 items left)"), text.stdout
        status = subprocess.run([*run, "status"], env=sq_env, capture_output=True, text=True)
        assert "ETA paused" in status.stdout, status.stdout
        queue.resume()  # and the ETA is back
        assert queue.stats().eta is not None
