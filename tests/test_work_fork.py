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


def _script(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with ``args``; it must succeed."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done


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
    done = _script(_FORK_IN_ITEM, store, str(home))
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


_FORK_IN_WITH = textwrap.dedent(
    """
    import os, sys
    from statequeue.api.queue import Queue

    q = Queue("q", home=sys.argv[1])
    for item in q.work():
        with item:
            child = os.fork()
            if child == 0:
                sys.exit(0)  # leaves the `with` block, in the child, by SystemExit
            os.waitpid(child, 0)
            with Queue("q", home=sys.argv[1]) as other:
                print(item.item, other.status().counts["running"], flush=True)
    q.close()
    """
)


def test_a_fork_leaving_a_with_block_leaves_the_item_to_the_loop(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with Queue("q", home=home) as q:
        q.enqueue(["a", "b"])
    done = _script(_FORK_IN_WITH, str(home))
    assert done.stdout.splitlines() == ["a 1", "b 1"]
    with Queue("q", home=home) as q:
        assert q.status().counts["done"] == 2
        assert [v.attempts for v in q.iter_items(None)] == [1, 1]


_FORK_IN_MAP = textwrap.dedent(
    """
    import os, sys
    import statequeue
    from statequeue.api.queue import Queue

    home = sys.argv[1]

    def fn(item):
        child = os.fork()
        if child == 0:
            if item == "a":
                sys.exit(0)  # leaves fn by SystemExit
            return "from the fork"  # leaves fn by returning
        os.waitpid(child, 0)
        with Queue("q", home=home) as other:
            (found,) = other.states(other.find_ids([item]).values()).values()
            os.write(1, f"{item} {found.value}\\n".encode())  # one write: slots run at once
        return item.upper()

    print(statequeue.map(fn, ["a", "b"], queue="q", home=home, jobs=2), flush=True)
    """
)


def test_a_fork_made_inside_a_map_function_records_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = _script(_FORK_IN_MAP, str(home))
    lines = done.stdout.splitlines()
    assert sorted(lines[:2]) == ["a running", "b running"], lines  # never given back
    assert lines[2:] == ["['A', 'B']"], lines  # the parents' results, not the forks'
    with Queue("q", home=home) as q:
        assert [v.attempts for v in q.iter_items(None)] == [1, 1]


_FORK_SETTLES = textwrap.dedent(
    """
    import os, sys
    from statequeue.api.queue import Queue
    from statequeue.core.errors import UsageError

    q = Queue("q", home=sys.argv[1])
    for item in q.work():
        child = os.fork()
        if child == 0:
            try:
                item.done("from the fork")
            except UsageError as exc:
                print("refused:", exc, flush=True)
            os._exit(0)
        os.waitpid(child, 0)
        item.done("from the loop")
    q.close()
    """
)


def test_a_fork_cannot_settle_its_parents_item(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with Queue("q", home=home) as q:
        q.enqueue(["a"])
    done = _script(_FORK_SETTLES, str(home))
    assert done.stdout.startswith("refused: item 1 is run by process "), done.stdout
    with Queue("q", home=home) as q:
        found = q.result("a")
        assert (found.result, found.attempt) == ("from the loop", 1)


_FORK_IN_MAP_ONE_SLOT = textwrap.dedent(
    """
    import os, sys
    import statequeue
    from statequeue.api.queue import Queue
    from statequeue.core.errors import UsageError

    home, how = sys.argv[1], sys.argv[2]

    def fn(item):
        child = os.fork()
        if child == 0:
            if how == "exit":
                sys.exit(0)
            return "from the fork"
        os.waitpid(child, 0)
        with Queue("q", home=home) as other:
            runners = len(other.status().runners)
            (found,) = other.states(other.find_ids([item]).values()).values()
            os.write(1, f"{item} {found.value} {runners}\\n".encode())
        return item.upper()

    try:
        print(statequeue.map(fn, ["a", "b", "c"], queue="q", home=home, jobs=1), flush=True)
    except UsageError as exc:  # only the fork, which returned from fn, gets here
        print("fork:", exc, file=sys.stderr, flush=True)
        os._exit(0)
    """
)


@pytest.mark.parametrize("how", ["exit", "return"])
def test_a_fork_in_a_one_slot_map_neither_claims_nor_unregisters(tmp_path: Path, how: str) -> None:
    """With one slot the map runs in the calling thread, which a fork copies:
    a fork returning from fn went on with the map, claiming the next items
    under its parent's runner and waiting for the parent's item (a deadlock);
    one leaving by SystemExit unregistered its parent's runner."""
    home = tmp_path / "home"
    done = _script(_FORK_IN_MAP_ONE_SLOT, str(home), how)
    # Each item running (its own), and the map's runner still registered.
    assert done.stdout.splitlines() == [
        "a running 1",
        "b running 1",
        "c running 1",
        "['A', 'B', 'C']",
    ]
    if how == "return":
        assert "returned from it" in done.stderr
    with Queue("q", home=home) as q:
        assert [v.attempts for v in q.iter_items(None)] == [1, 1, 1]
