"""A fork made inside a ``work()`` item must not give the item back when it
exits. The child's copy of the loop's generator is closed as its interpreter
shuts down, and its cleanup (``end_work``) released the parent's item
through the child's reopened store: another runner could then start it while
the parent still ran it, and the parent's ``done()`` raised ClaimLost. Only
the loop's own process ends the loop now. On both stores (PostgreSQL: a
real server, tests/pg.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from statequeue.api.queue import Queue

_FORK_IN_ITEM = textwrap.dedent(
    """
    import os, sys
    from statequeue.api.queue import Queue

    store = sys.argv[1] or None
    q = Queue("q", store=store, home=sys.argv[2])
    for item in q.work():
        child = os.fork()
        if child == 0:
            sys.exit(0)  # the child's interpreter shuts down: its copy of the loop closes
        os.waitpid(child, 0)
        with Queue("q", store=store, home=sys.argv[2]) as other:
            counts = other.status().counts
            print(item.item, counts["running"], counts["pending"], flush=True)
        item.done()
    q.close()
    """
)


def _run(store: str, home: Path) -> list[str]:
    with Queue("q", store=store or None, home=home) as q:
        q.enqueue(["a", "b"])
    done = subprocess.run(
        [sys.executable, "-c", _FORK_IN_ITEM, store, str(home)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    with Queue("q", store=store or None, home=home) as q:
        assert q.status().counts["done"] == 2
        assert [v.attempts for v in q.iter_items(None)] == [1, 1]
    return done.stdout.splitlines()


def test_a_fork_exiting_inside_an_item_leaves_it_claimed_local(tmp_path: Path) -> None:
    # Each item still running (1), the other pending or done: never given back.
    assert _run("", tmp_path / "home") == ["a 1 1", "b 1 0"]


def test_a_fork_exiting_inside_an_item_leaves_it_claimed_postgres(
    pg_url: str, tmp_path: Path
) -> None:
    pytest.importorskip("psycopg")
    assert _run(pg_url, tmp_path / "home") == ["a 1 1", "b 1 0"]
