"""Two PostgreSQL leftovers of issue 12: a cancelled item keeps the count of
its attempts (shown, exported and imported), and `drop` removes the queue's
scratch folder on this host (real server, see tests/pg.py)."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest

from statequeue.api.queue import Queue
from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, Outcome
from tests.conftest import STATEQUEUE

pytest.importorskip("psycopg")

FAILED = Outcome(ok=False, exit_code=1)


def _failed_twice_then_cancelled(q: Queue) -> None:
    q.enqueue(["a", "b"])
    runner = new_runner()
    for _ in range(2):
        claim = q.claim(runner)
        assert claim is not None and claim.item_id == 1
        q.finish(claim, FAILED, retry_at=0.0 if _ == 0 else None)
    assert q.cancel([1]) == [1]


def test_a_cancelled_item_keeps_its_attempts(pg_url: str, tmp_path: Path) -> None:
    with Queue("q", home=tmp_path, store=pg_url) as q:
        _failed_twice_then_cancelled(q)
        [view] = [v for v in q.items() if v.item_id == 1]
        assert (view.state, view.attempts) == (ItemState.CANCELLED, 2)
        out = io.BytesIO()
        q.export(out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    [item] = [e for e in lines if e.get("id") == 1]
    assert (item["state"], item["attempts"]) == ("cancelled", 2)


def test_drop_removes_the_queue_scratch_folder(
    pg_url: str, sq_env: dict[str, str], tmp_path: Path
) -> None:
    env = dict(sq_env, STATEQUEUE_STORE=pg_url)
    subprocess.run([STATEQUEUE, "enqueue", "-q", "gone", "a"], env=env, check=True, timeout=60)
    scratch = Path(env["STATEQUEUE_HOME"]) / ".postgres" / "gone"
    assert scratch.is_dir()
    kept = Path(env["STATEQUEUE_HOME"]) / ".postgres" / "kept"
    subprocess.run([STATEQUEUE, "enqueue", "-q", "kept", "a"], env=env, check=True, timeout=60)
    subprocess.run([STATEQUEUE, "drop", "gone", "--yes"], env=env, check=True, timeout=60)
    assert not scratch.exists()
    assert kept.is_dir()  # another queue's scratch stays


def test_queue_drop_removes_its_scratch_folder(pg_url: str, tmp_path: Path) -> None:
    q = Queue("gone", home=tmp_path, store=pg_url)
    q.enqueue(["a"])
    scratch = tmp_path / ".postgres" / "gone"
    assert scratch.is_dir()
    q.drop()
    assert not scratch.exists()


DIES_REGISTERED = """
import os, sys
from statequeue import Queue
from statequeue.core.identity import new_runner
q = Queue("q", store=sys.argv[1], home=sys.argv[2])
q.register_runner(new_runner())
os._exit(0)  # its row stays: the runner died without unregistering
"""


def test_drop_after_a_runner_of_this_host_died(
    pg_url: str, sq_env: dict[str, str], sq_home: Path
) -> None:
    """A runner killed on this host left its row; drop refused "has an active
    runner (pid N on HOST)" naming the dead pid until the lease ran out. A
    dead pid of this host is not an active runner (as `run --single` says)."""
    import sys

    died = subprocess.run(
        [sys.executable, "-c", DIES_REGISTERED, pg_url, str(sq_home)], env=sq_env, timeout=60
    )
    assert died.returncode == 0
    dropped = subprocess.run(
        [STATEQUEUE, "drop", "-q", "q", "--store", pg_url, "--yes"],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dropped.returncode == 0, dropped.stderr
