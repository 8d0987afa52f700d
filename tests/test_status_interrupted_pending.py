"""`status` says which pending items carry the mark of an interrupted attempt.

Items in flight when their runner died go back to pending marked so: the
next run with ``--verify`` checks them before it runs them. When that check
was broken (exit 127: its command not found), the run stopped and gave them
back still marked, and `status` showed them as plain pending, though the
next run remembers the mark. It now lists them (``interrupted_pending`` in
--json), on either store.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from statequeue import Queue
from tests.conftest import STATEQUEUE
from tests.dead_runner import die_holding_two

USAGE = 2


def test_items_given_back_by_a_broken_check_are_shown_interrupted(
    sq_env: dict[str, str], sq_home: Path, store_url: str
) -> None:
    store = ["--store", store_url] if store_url else []
    with Queue(home=sq_home, store=store_url or None) as q:
        q.enqueue(["1", "2", "3"])
    die_holding_two(sq_env, sq_home, store_url)
    broken = "test -n {} && no-such-checker {}"
    done = subprocess.run(
        [STATEQUEUE, *store, "run", "--verify", broken, "--", "true"],
        env=sq_env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == USAGE, done.stderr
    assert "exit 127" in done.stderr, done.stderr
    shown = subprocess.run(
        [STATEQUEUE, *store, "status", "--json"],
        env=sq_env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    status = json.loads(shown.stdout)
    assert status["counts"]["pending"] == 3, status
    assert status["interrupted"] == [], status  # recovered already: not running
    assert status["interrupted_pending"] == [1, 2], status
    text = subprocess.run(
        [STATEQUEUE, *store, "status"],
        env=sq_env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "interrupted, back to pending (--verify checks them first): 2 items: #1, #2" in text
    # The mark is what the next run goes by: it checks both before running them.
    ran = subprocess.run(
        [STATEQUEUE, *store, "run", "--verify", "test {} = 1", "--", "true"],
        env=sq_env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    with Queue(home=sq_home, store=store_url or None, create=False) as q:
        assert q.status().interrupted_pending == ()
