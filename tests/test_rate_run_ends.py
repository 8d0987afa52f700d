"""`run --rate` ends when the queue has nothing left, not when the next start
comes due: with `--rate 1/h`, the run of a queue's last item used to wait out
the hour (the start it had been refused) before it looked, found nothing, and
exited."""

from __future__ import annotations

import subprocess

from statequeue import Queue
from tests.conftest import STATEQUEUE

HANG = 60  # seconds: far below the hour the old run waited, far above a run of one item


def test_a_slow_rate_run_exits_once_the_queue_is_empty(sq_env: dict[str, str]) -> None:
    with Queue(home=sq_env["STATEQUEUE_HOME"]) as q:
        q.enqueue(["a"])
    try:
        done = subprocess.run(
            [STATEQUEUE, "run", "--rate", "1/h", "--", "true"],
            env=sq_env,
            capture_output=True,
            text=True,
            timeout=HANG,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("the run waited for its next start with nothing left") from exc
    assert done.returncode == 0, done.stderr
    with Queue(home=sq_env["STATEQUEUE_HOME"], create=False) as q:
        assert q.status().counts["done"] == 1
