"""A retry that comes due while its claim is held (issue 21, point 8).

The failed attempt leaves a detached process (a new session) that the keeper
watches and holds the item's claim for. The retry comes due before it ends:
the run used to end at once with exit 0 and the item pending, its retries
unused. The run waits for the claim (README, promise 4: "retries and the next
run wait for the claim"), and never starts an attempt beside a leftover.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from statequeue.api.queue import Queue
from statequeue.core.models import ItemState, RunnerInfo
from tests.conftest import STATEQUEUE

# Each attempt but the last leaves a `setsid sleep 3` like the issue's, logging its end; the
# last leaves none, so nothing of the test outlives the run.
WORKER = """
echo "start $STATEQUEUE_ATTEMPT" >> "$0"
if [ "$STATEQUEUE_ATTEMPT" -lt 3 ]; then
  setsid sh -c 'sleep 3; echo "end $1" >> "$0"' "$0" "$STATEQUEUE_ATTEMPT" \
    </dev/null >/dev/null 2>&1 &
fi
exit 1
"""


def test_run_waits_for_a_held_claim_and_uses_its_retries(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path
) -> None:
    log = tmp_path / "attempts.log"
    subprocess.run([STATEQUEUE, "enqueue", "a"], env=sq_env, check=True, capture_output=True)
    done = subprocess.run(
        [STATEQUEUE, "run", "--retries", "2", "--", "sh", "-c", WORKER, str(log)],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr  # ExitCode.FAILED, not 0 with the item pending
    with Queue(home=sq_home) as q:
        (item,) = q.store.items()
    assert (item.state, item.attempts) == (ItemState.FAILED, 3)
    # Each retry started only once the previous attempt's leftover had ended.
    assert log.read_text().split("\n") == [
        "start 1",
        "end 1",
        "start 2",
        "end 2",
        "start 3",
        "",
    ]


def test_a_pending_item_whose_claim_is_held_still_counts_as_due(sq_home: Path) -> None:
    """The store's side, for any pending item (a retry, or one a stopped run
    gave back): while a leftover holds its claim, ``claim`` skips it but
    ``next_due`` still names it, so a run (or a work loop) waits rather than ends."""
    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
        runner = RunnerInfo("r", os.getpid(), "h", "", time.time())
        q.store.register_runner(runner)
        claim = q.store.claim(runner)
        assert claim is not None
        leftover = os.dup(claim.inherit_fds[0])  # a detached leftover keeps the claim
        try:
            q.store.release(claim, "interrupted: runner stopped by a signal")
            assert q.store.claim(runner) is None  # held
            assert q.store.next_due() == 0.0  # due now, not "nothing waits"
        finally:
            os.close(leftover)
        again = q.store.claim(runner)
        assert again is not None and again.item_id == claim.item_id
