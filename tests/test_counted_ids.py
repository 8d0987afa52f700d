"""`status` and `stats` list held (and interrupted) items as a count and ids:
"held: 2" read as two held items when it was item #2 (`status` said
"held 1" above it). Now: "held: 1 item: #2"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import STATEQUEUE

DIES_HOLDING = """
import os, sys
from statequeue import Queue
from statequeue.core.identity import new_runner
q = Queue(home=sys.argv[1])
runner = new_runner()
q.register_runner(runner)
q.claim(runner)
os._exit(0)  # dies with item 1 claimed: its runner is gone
"""


def test_held_items_are_a_count_and_ids(sq_env: dict[str, str], sq_home: Path) -> None:
    added = subprocess.run([STATEQUEUE, "enqueue", "a", "b", "c"], env=sq_env, check=False)
    assert added.returncode == 0
    died = subprocess.run([sys.executable, "-c", DIES_HOLDING, str(sq_home)], env=sq_env)
    assert died.returncode == 0
    ran = subprocess.run(
        [STATEQUEUE, "run", "--on-interrupted", "hold", "--", "true"],
        env=sq_env,
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 1, ran.stderr  # it held an item (test_run_counts_recovery)
    status = subprocess.run([STATEQUEUE, "status"], env=sq_env, capture_output=True, text=True)
    assert "held (poison or on hold): 1 item: #1" in status.stdout, status.stdout
    stats = subprocess.run([STATEQUEUE, "stats"], env=sq_env, capture_output=True, text=True)
    assert "held: 1 item: #1" in stats.stdout, stats.stdout
