"""Issue 23: a persistent run has the next claim made ready while its workers work.

``Store.reserve`` holds the claim lock of the item the next claim would take,
with its text loaded, and writes nothing: the item stays pending to every
reader, no other process can claim it meanwhile, and a reservation that is let
go, or whose process dies, leaves nothing to recover. The runner reserves
while every persistent worker is busy with short items, so that the claim on
the way from a reply to the next request needs no search. Real processes and
the journal store throughout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from statequeue import Queue
from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, Outcome
from statequeue.store.journal.store import JournalStore
from statequeue.store.memory import MemoryStore
from tests.conftest import STATEQUEUE
from tests.persistent_worker import write_worker
from tests.waiting import until

RUN_TIMEOUT = 120

# Claims one item in a process of its own and prints it (or "none"), leaving it
# claimed when argv[2] is "keep" (the process then waits to be killed).
CLAIMER = textwrap.dedent(
    """
    import sys, time
    from statequeue import Queue
    from statequeue.core.identity import new_runner
    q = Queue(home=sys.argv[1])
    runner = new_runner()
    claim = q.claim(runner)
    print(claim.item if claim else "none", flush=True)
    if claim is not None and sys.argv[2] == "release":
        q.release(claim, "test", uncounted=True)
    """
)

# Reserves in a process of its own, says so, then waits to be killed.
RESERVER = textwrap.dedent(
    """
    import sys, time
    from statequeue import Queue
    q = Queue(home=sys.argv[1])
    print(q.reserve(), flush=True)
    time.sleep(300)
    """
)


def _claim_elsewhere(home: Path, then: str = "release") -> str:
    done = subprocess.run(
        [sys.executable, "-c", CLAIMER, str(home), then],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=True,
    )
    return done.stdout.strip()


def _begun(marks: Path, item: str) -> int:
    """The pid of the worker that began ``item`` (0: not begun yet)."""
    try:
        return int((marks / f"{item}.pid").read_text().split()[0])
    except (FileNotFoundError, IndexError):
        return 0


def _held(home: Path, item_id: int) -> bool:
    """Whether some process holds item ``item_id``'s claim lock."""
    with Queue(home=home) as q:
        store = q.store
        assert isinstance(store, JournalStore)
        return not store.claims.free(item_id)


def _states(home: Path) -> dict[str, tuple[ItemState, int]]:
    with Queue(home=home) as q:
        return {v.item: (v.state, v.attempts) for v in q.items()}


def test_a_reserved_item_stays_pending_and_the_next_claim_takes_it(sq_home: Path) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a", "b", "c"])
        assert q.reserve()
        assert q.reserve()  # one at most: holding one already
        assert q.status().counts["pending"] == 3  # nothing written
        assert _states(sq_home)["a"] == (ItemState.PENDING, 0)
        # Another process skips it: its claim lock is held here.
        assert _claim_elsewhere(sq_home) == "b"
        claim = q.claim(new_runner())
        assert claim is not None and claim.item == "a" and claim.attempt == 1
        q.finish(claim, Outcome(ok=True, exit_code=0))
    states = _states(sq_home)
    assert states["a"] == (ItemState.DONE, 1)
    assert states["b"][0] is states["c"][0] is ItemState.PENDING  # b: claimed and given back


def test_an_item_let_go_is_claimable_by_others_again(sq_home: Path) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a", "b"])
        assert q.reserve()
        q.unreserve()
        assert _claim_elsewhere(sq_home) == "a"
        # Reserved again (it is "a" once more: nothing was written) and taken by a claim.
        assert q.reserve()
        claim = q.claim(new_runner())
        assert claim is not None and claim.item == "a"


def test_a_reserved_item_cancelled_meanwhile_is_not_claimed(sq_home: Path) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a", "b"])
        assert q.reserve()
        with Queue(home=sq_home) as other:  # a user's `cancel 1`, by another store object
            assert other.cancel([1]) == [1]
        claim = q.claim(new_runner())
        assert claim is not None and claim.item == "b"
        assert q.claim(new_runner()) is None
    assert _states(sq_home)["a"] == (ItemState.CANCELLED, 0)


def test_a_reservation_ends_with_its_process_leaving_nothing_to_recover(sq_home: Path) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a", "b"])
    with subprocess.Popen(
        [sys.executable, "-c", RESERVER, str(sq_home)], stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "True"
        assert _claim_elsewhere(sq_home) == "b"  # "a" is held
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=RUN_TIMEOUT)
    assert _claim_elsewhere(sq_home) == "a"  # free at once, as if never reserved
    with Queue(home=sq_home) as q:
        events = q.history(1).events
    # The claim just made (and given back) is the only one: the reservation wrote nothing.
    assert [e["t"] for e in events if e.get("t") != "enq"] == ["start", "intr"]
    assert [e["attempt"] for e in events if e.get("t") == "start"] == [1]
    assert not [e for e in events if "crashes" in e]


def test_a_persistent_run_reserves_its_next_item_while_a_worker_works(
    sq_home: Path, sq_env: dict[str, str], tmp_path: Path
) -> None:
    program, marks = write_worker(tmp_path)
    items = ["ok-1", "ok-2", "ok-3", "hang-4", "ok-5", "ok-6"]
    with Queue(home=sq_home) as q:
        q.enqueue(items)
    argv = [STATEQUEUE, "run", "--persistent", "--on-interrupted", "fail", "--"]
    argv += [sys.executable, program, str(marks)]
    with subprocess.Popen(argv, env=sq_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as run:
        try:
            _reserves_while_hang_4_runs(sq_home, marks)
        except BaseException:
            run.terminate()  # its worker ends with it (no 300 s wait for hang-4)
            raise
        _out, err = run.communicate(timeout=RUN_TIMEOUT)
        assert run.returncode == 1, err  # hang-4 failed
    states = _states(sq_home)
    assert states.pop("hang-4")[0] is ItemState.FAILED
    assert states.pop("ok-6")[0] is ItemState.DONE  # claimed and given back by the test
    assert states == {item: (ItemState.DONE, 1) for item in items if item[-1] in "1235"}
    assert not (marks / "overlap").exists()


def _reserves_while_hang_4_runs(sq_home: Path, marks: Path) -> None:
    until(lambda: _begun(marks, "hang-4"), "hang-4 to start")
    until(lambda: _held(sq_home, 5), "ok-5 to be reserved")
    # The ok- items were short, so while hang-4 runs, ok-5 is held ready:
    # pending to everyone, claimable by no one else; another process gets ok-6.
    assert _states(sq_home)["ok-5"] == (ItemState.PENDING, 0)
    assert _claim_elsewhere(sq_home) == "ok-6"
    pid = _begun(marks, "hang-4")
    os.kill(pid, signal.SIGKILL)  # the worker dies mid-item: hang-4 is interrupted


@pytest.mark.parametrize("jobs", [1, 2])
def test_every_item_runs_once_when_the_run_reserves_between_short_items(
    sq_home: Path, sq_env: dict[str, str], tmp_path: Path, jobs: int
) -> None:
    program, marks = write_worker(tmp_path)
    items = [f"ok-{n}" for n in range(60)]
    with Queue(home=sq_home) as q:
        q.enqueue(items)
    argv = [STATEQUEUE, "run", "--persistent", f"-j{jobs}", "--"]
    argv += [sys.executable, program, str(marks)]
    done = subprocess.run(argv, env=sq_env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert _states(sq_home) == {item: (ItemState.DONE, 1) for item in items}
    for item in items:  # begun once each, by a worker
        assert len((marks / f"{item}.pid").read_text().split()) == 1


@pytest.mark.parametrize("kind", ["journal", "memory", "postgres"])
def test_every_store_keeps_the_claim_contract_with_a_reservation(
    kind: str, request: pytest.FixtureRequest, sq_home: Path
) -> None:
    """A store that can reserve (journal, memory) hands the reserved item to the next
    claim and lets it go on ``unreserve``; one that cannot (PostgreSQL) says False,
    and its claims go on as before."""
    if kind == "memory":
        q = Queue("rs", store=MemoryStore("rs"))
    elif kind == "postgres":
        q = Queue("rs", home=sq_home, store=str(request.getfixturevalue("pg_url")))
    else:
        q = Queue("rs", home=sq_home)
    runner = new_runner()
    with q:
        q.store.register_runner(runner)
        q.enqueue(["a", "b", "c"])
        held = q.reserve()
        assert held is (kind != "postgres")
        assert q.status().counts["pending"] == 3  # nothing written either way
        q.unreserve()
        assert q.reserve() is held
        first = q.claim(runner)
        assert first is not None and (first.item, first.attempt) == ("a", 1)
        q.finish(first, Outcome(ok=True, exit_code=0))
        q.unreserve()  # none held: nothing to do
        second = q.claim(runner)
        assert second is not None and second.item == "b"
        q.finish(second, Outcome(ok=True, exit_code=0))
        assert q.status().counts == {**q.status().counts, "done": 2, "pending": 1}
