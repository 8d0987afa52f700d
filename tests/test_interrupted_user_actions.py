"""``cancel`` and ``retry`` of an item a dead runner left.

After a kill -9 of a run, ``status`` lists its items as interrupted ("the
next run recovers them", no runner active), but ``cancel`` and ``retry``
refused them: "it is running". They now recover such an item first, as the
next run would, then act on it. An item whose runner lives is still refused.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from statequeue import Queue
from statequeue.core.errors import UsageError
from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from tests.conftest import STATEQUEUE
from tests.dead_runner import die_holding_two


def _interrupted(sq_env: dict[str, str], sq_home: Path, store_url: str) -> list[str]:
    with Queue(home=sq_home, store=store_url or None) as q:
        q.enqueue(["a", "b", "c"])
    die_holding_two(sq_env, sq_home, store_url)
    return ["--store", store_url] if store_url else []


def _sq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STATEQUEUE, *args], env=env, capture_output=True, text=True, check=False)


def _states(sq_home: Path, store_url: str) -> dict[str, str]:
    with Queue(home=sq_home, store=store_url or None, create=False) as q:
        return {v.item: v.state.value for v in q.store.items()}


def test_cancel_takes_an_interrupted_item(
    sq_env: dict[str, str], sq_home: Path, store_url: str
) -> None:
    store = _interrupted(sq_env, sq_home, store_url)
    done = _sq(sq_env, *store, "cancel", "1")
    assert done.returncode == 0, done.stderr
    states = _states(sq_home, store_url)
    assert states["a"] == "cancelled", states
    # The other item the dead runner left waits for the next run (and its
    # --on-interrupted): a cancel recovers only what it names.
    assert states["b"] == "running", states
    again = _sq(sq_env, *store, "cancel", "2")
    assert again.returncode == 0, again.stderr
    assert _states(sq_home, store_url)["b"] == "cancelled"


def test_retry_takes_an_interrupted_item(
    sq_env: dict[str, str], sq_home: Path, store_url: str
) -> None:
    store = _interrupted(sq_env, sq_home, store_url)
    done = _sq(sq_env, *store, "retry", "2")
    assert done.returncode == 0, done.stderr
    assert _states(sq_home, store_url)["b"] == "pending"
    assert _states(sq_home, store_url)["a"] == "running"  # not named: left to the next run
    # A new episode: no crash mark left for --verify and --on-interrupted to
    # settle it by (it was failed unrun), so it runs.
    ran = _sq(sq_env, *store, "run", "--on-interrupted", "hold", "--verify", "false", "--", "true")
    assert ran.returncode != 2, ran.stderr
    assert _states(sq_home, store_url)["b"] == "done", ran.stderr


def test_an_item_whose_runner_lives_is_still_refused(sq_home: Path) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
        runner = new_runner()
        q.register_runner(runner)
        claim = q.claim(runner)
        assert claim is not None
        with pytest.raises(UsageError, match="it is running"):
            q.cancel([claim.item_id])
        with pytest.raises(UsageError, match="it is running"):
            q.retry([claim.item_id])
        q.finish(claim, Outcome(ok=True))
