"""``Queue.work()`` on PostgreSQL records an item's result and claims the loop's
next item in one store step (issue 21 point 14): one commit, as ``run`` does
with ``finish_and_claim``. The local stores claim when the loop hands the next
item out (a claim there costs no fsync): a program killed between a done()
and its next item leaves no claim of an item it never saw, which recovery
counted as an interrupted attempt (three such kills held it as poison). Same
semantics on every store: the result is durable when done() returns, a loop
left early gives a claimed-but-unstarted item back uncounted, and a kill -9
re-runs at most the items in flight (a real kill; PostgreSQL is a real
throwaway server)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statequeue import ItemState, Queue
from statequeue.store.memory import MemoryStore
from tests.library_kill import run_kill_and_resume

STORES = ("journal", "memory", "postgres")


def _open(kind: str, request: pytest.FixtureRequest, sq_home: Path) -> Queue:
    if kind == "memory":
        return Queue("fw", store=MemoryStore("fw"))
    if kind == "postgres":
        url: str = request.getfixturevalue("pg_url")
        return Queue("fw", home=sq_home, store=url)
    return Queue("fw", home=sq_home)


def _count_calls(q: Queue, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = dict.fromkeys(("claim", "finish", "finish_and_claim"), 0)
    store = q.store
    for name in calls:
        original = getattr(store, name)

        def spy(*args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
            calls[_name] += 1
            return _original(*args, **kw)

        monkeypatch.setattr(store, name, spy)
    return calls


@pytest.mark.parametrize("kind", STORES)
def test_done_and_fail_claim_the_next_item_in_the_same_step(
    kind: str, request: pytest.FixtureRequest, sq_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _open(kind, request, sq_home) as q:
        q.enqueue(["a", "b", "bad", "c", "d"])
        calls = _count_calls(q, monkeypatch)
        seen = []
        for item in q.work():
            seen.append((item.item, item.attempt))
            with item:
                if item.item == "bad":
                    raise ValueError("no")
                item.done(item.item.upper())
        assert seen == [("a", 1), ("b", 1), ("bad", 1), ("c", 1), ("d", 1)]
        if kind == "postgres":
            # One step per item; plain claims only for the first item and to
            # learn that none is left (a plain claim recovers before saying so,
            # and the loop asks once more in case a resume came meanwhile).
            assert calls["finish"] == 0
            assert calls["finish_and_claim"] == 5
            assert calls["claim"] <= 3
        else:  # a claim per item handed out, and the looks for one more
            assert calls["finish_and_claim"] == 0
            assert calls["finish"] == 5
            assert 5 < calls["claim"] <= 7
        assert [r.result for r in q.results(ItemState.DONE)] == ["A", "B", "C", "D"]
        bad = q.result("bad")
        assert bad is not None and bad.state is ItemState.FAILED and bad.reason == "ValueError: no"
        assert q.status().runners == ()


@pytest.mark.parametrize("kind", STORES)
def test_a_loop_left_after_done_gives_the_next_item_back_uncounted(
    kind: str, request: pytest.FixtureRequest, sq_home: Path
) -> None:
    with _open(kind, request, sq_home) as q:
        q.enqueue(["a", "b", "c"])
        for item in q.work():
            item.done("A")
            break  # b was claimed by that done(), and never started
        views = {v.item: v for v in q.items()}
        assert views["a"].state is ItemState.DONE
        assert views["b"].state is ItemState.PENDING
        assert views["c"].state is ItemState.PENDING
        assert q.status().runners == ()
        attempts = {item.item: item.attempt for item in q.work() if item.done() or True}
        assert attempts == {"b": 1, "c": 1}  # b's give-back counted no attempt, no crash
        assert q.history("b").state is ItemState.DONE


KILLED_AFTER_DONE = """
import os, signal, sys
from statequeue import Queue
with Queue("fw", home=sys.argv[1]) as q:
    for item in q.work():
        item.done(item.item.upper())
        os.kill(os.getpid(), signal.SIGKILL)  # after a result, before the next item
"""


def test_a_program_killed_after_done_leaves_no_claim_of_its_next_item(
    sq_home: Path, tmp_path: Path
) -> None:
    """Three kills between a done() and the loop's next item: on a local
    store the next item was claimed by that done(), so each kill counted an
    interrupted attempt of an item the program never saw, and the third held
    it as poison. Now each kill costs nothing but the killed run."""
    import subprocess
    import sys

    with Queue("fw", home=sq_home) as q:
        q.enqueue(["a", "b", "c", "d"])
    script = tmp_path / "killed.py"
    script.write_text(KILLED_AFTER_DONE)
    for _ in range(3):
        proc = subprocess.run([sys.executable, str(script), str(sq_home)], timeout=120)
        assert proc.returncode == -9
    with Queue("fw", home=sq_home, create=False) as q:
        views = {v.item: v for v in q.items()}
        assert [views[x].state for x in "abc"] == [ItemState.DONE] * 3
        assert views["d"].state is ItemState.PENDING, views["d"]
        assert views["d"].attempts == 0, views["d"]
        seen = [(i.item, i.attempt, i.interrupted) for i in q.work() if i.done() or True]
        assert seen == [("d", 1, False)]


@pytest.mark.parametrize("kind", STORES)
def test_an_interrupt_inside_done_leaves_the_loop_as_an_interrupt(
    kind: str, request: pytest.FixtureRequest, sq_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C landing inside done() (in its fsync or commit) after the result
    was written: the give-back of the item, now settled, raised a store
    error ("no longer claimed", "already settled") that replaced the
    KeyboardInterrupt, so `except KeyboardInterrupt` never ran and the
    program exited 1 with tracebacks. The interrupt now ends the loop as
    itself, with the result kept and nothing left claimed."""
    with _open(kind, request, sq_home) as q:
        q.enqueue(["a", "b"])
        store = q.store
        name = "finish_and_claim" if store.chains_claims else "finish"
        original = getattr(store, name)

        def written_then_interrupted(*args: Any, **kw: Any) -> Any:
            original(*args, **kw)
            raise KeyboardInterrupt

        monkeypatch.setattr(store, name, written_then_interrupted)
        loop = q.work()
        with pytest.raises(KeyboardInterrupt):
            for item in loop:
                with item:
                    item.done("A")
        loop.close()  # as a program's exit does: the loop gives back what it holds
        monkeypatch.undo()
        a = q.result("a")
        assert a is not None and a.state is ItemState.DONE and a.result == "A"
        assert q.status().runners == ()
        if not store.chains_claims:  # the claim of b was never made
            assert {v.item: v.attempts for v in q.items()}["b"] == 0


def test_kill_9_during_work_then_resume(tmp_path: Path, sq_env: dict[str, str]) -> None:
    run_kill_and_resume(tmp_path, sq_env, "work")


# -- PostgreSQL: many loops start and recover side by side -------------------------

HANG_GUARD = 30.0  # a join's timeout: a guard against a hang, never a timing


def _in_thread(call: Callable[[], object]) -> list[object]:
    """Run ``call`` in a thread; the list holds its result or error once joined."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:  # handed to the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD)
    return out


def test_runners_register_side_by_side_and_an_exclusive_one_is_still_refused(
    pg_url: str,
) -> None:
    psycopg = pytest.importorskip("psycopg")
    from statequeue.core.errors import RunnerActive
    from statequeue.core.identity import new_runner
    from statequeue.store.postgres import PostgresStore

    first, second, third = (PostgresStore(pg_url, "side") for _ in range(3))
    try:
        with psycopg.connect(pg_url, autocommit=True) as other, other.transaction():
            # A runner registering right now holds the row as a registration does.
            other.execute("SELECT 1 FROM statequeue.queues WHERE name = 'side' FOR SHARE")
            done = _in_thread(lambda: first.register_runner(new_runner()))
            assert done == [None], "a registration waited for another one"
        second.register_runner(new_runner())
        refused = _in_thread(lambda: third.register_runner(new_runner(), exclusive=True))
        assert len(refused) == 1 and isinstance(refused[0], RunnerActive)
    finally:
        for store in (first, second, third):
            store.close()


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("where", ["claim", "settle"])
def test_ctrl_c_inside_a_claiming_store_call_leaves_nothing_claimed(
    kind: str,
    where: str,
    request: pytest.FixtureRequest,
    sq_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real SIGINT landing inside the store call that claims (the loop's
    claim, or a done() that claims the next item on PostgreSQL) after the
    claim was made: the loop never learnt of it, the program exited
    cleanly, and the item stayed running until recovery counted an
    interrupted attempt of an item the program never saw. The interrupt
    now waits for the call, and the claim goes back uncounted."""
    import os
    import signal

    # Python's own SIGINT handler, as a program has it (another test may have left its own).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    with _open(kind, request, sq_home) as q:
        q.enqueue(["a", "b", "c"])
        store = q.store
        if where == "claim":
            name = "claim"
        else:
            name = "finish_and_claim" if store.chains_claims else "finish"
        original = getattr(store, name)
        calls = []

        def interrupted_after(*args: Any, **kw: Any) -> Any:
            value = original(*args, **kw)
            calls.append(value)
            if (where == "claim" and len(calls) == 1) or where == "settle":
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, after the store's work
            return value

        monkeypatch.setattr(store, name, interrupted_after)
        loop = q.work()
        with pytest.raises(KeyboardInterrupt):
            for item in loop:
                with item:
                    item.done(item.item.upper())
        loop.close()
        monkeypatch.undo()
        views = {v.item: v for v in q.items()}
        # claim: a was claimed and never handed out; settle: a is done and
        # b (claimed by that done() on PostgreSQL) was never handed out.
        first = "a" if where == "claim" else "b"
        if where == "settle":
            assert views["a"].state is ItemState.DONE
        assert [views[x].state for x in first + "c"] == [ItemState.PENDING] * 2, views
        assert views[first].attempts == 0, views[first]
        assert q.status().runners == ()


EXITS_HOLDING = """
import sys
from statequeue import Queue
with Queue("fw", home=sys.argv[1]) as q:
    loop = q.work()
    print(next(loop).item)  # the program ends here, its item unsettled, the loop never closed
"""


def test_a_program_that_ends_holding_an_item_gives_it_back(sq_home: Path, tmp_path: Path) -> None:
    """Closing the Queue left the open loop's item claimed: recovery counted a
    crash at each such clean exit, and the fourth run found it held as
    poison. close() now closes the loops first: the item goes back."""
    import subprocess
    import sys

    with Queue("fw", home=sq_home) as q:
        q.enqueue(["a", "b"])
    script = tmp_path / "holding.py"
    script.write_text(EXITS_HOLDING)
    for _ in range(4):
        done = subprocess.run(
            [sys.executable, str(script), str(sq_home)], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0 and done.stdout == "a\n", done.stderr
    with Queue("fw", home=sq_home, create=False) as q:
        status = q.status()
        assert status.counts["running"] == 0 and status.counts["held"] == 0, status.counts
        assert status.interrupted == () or not status.interrupted
        assert [i.item for i in q.work(max_crashes=1) if i.done() or True] == ["a", "b"]


def test_done_after_the_loop_ended_says_the_item_was_given_back(sq_home: Path) -> None:
    """After a `break`, the loop gives its item back; a done() then raised a
    bare StateQueueError "no longer claimed by runner ..."."""
    from statequeue.core.errors import UsageError

    with Queue("fw", home=sq_home) as q:
        q.enqueue(["a"])
        loop = q.work()
        item = next(loop)
        loop.close()  # as a `break` out of the for loop does
        with pytest.raises(UsageError, match="was given back"):
            item.done()
        assert {v.item: v.state for v in q.items()} == {"a": ItemState.PENDING}


@pytest.mark.parametrize("kind", STORES)
def test_an_interrupt_between_the_item_and_its_claim_gives_it_back_once(
    kind: str, request: pytest.FixtureRequest, sq_home: Path
) -> None:
    """The loop makes the next item of the claim its done() took with no store
    call and no deferred interrupt: a KeyboardInterrupt between that line and
    the next leaves the claim in both the item and ``taken``. It goes back
    once, uncounted, and the loop's end raises nothing of its own."""
    from statequeue.api.work import WorkItem, WorkPolicy, end_work
    from statequeue.core.identity import new_runner

    q = _open(kind, request, sq_home)
    try:
        q.enqueue(["a"])
        runner = new_runner(("python",))
        q.register_runner(runner)
        claim = q.claim(runner)
        assert claim is not None
        item = WorkItem(q, claim, WorkPolicy(), runner=runner)
        end_work(q, runner.runner_id, item, claim)  # not best effort: an error would show
        assert item.released
        (view,) = q.items()
        assert (view.state, view.attempts) == (ItemState.PENDING, 0)
    finally:
        q.close()
