"""The runner's per-item fast path (issue 14): the fused finish + next claim,
the journal read skipped when only this process wrote, the program found on
PATH once per run. Each keeps the promises of the slow path it replaces."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statequeue.api.queue import Queue
from statequeue.core.fileio import FileOps
from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, Outcome
from statequeue.run.keeper_os import find_program
from statequeue.run.keeper_process import KeeperProcess
from statequeue.run.options import RunOptions
from statequeue.run.runner import Runner
from statequeue.store.journal.store import JournalStore
from tests.faults.powerloss import PowerCut, PowerLossOps, Variant, apply_cut
from tests.faults.test_crash_points import sq, sweep
from tests.test_store_contract import BAD, OK, STORES, Harness

# -- the Store method (every store: journal, memory, PostgreSQL) --------------------


@pytest.fixture(params=STORES)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else ""
    h = Harness(request.param, tmp_path / "q", url)
    yield h
    h.close()


def test_finish_and_claim_records_the_result_and_claims_the_next(harness: Harness) -> None:
    store = harness.open()
    store.enqueue(["a", "b", "c"])
    runner = new_runner()
    first = store.claim(runner)
    assert first is not None and first.item == "a"
    state, second = store.finish_and_claim(first, OK, runner=runner)
    assert state is ItemState.DONE
    assert second is not None and (second.item, second.attempt) == ("b", 1)
    state, third = store.finish_and_claim(second, BAD, runner=runner, among=[1, 2])
    assert state is ItemState.FAILED
    assert third is None  # c (id 3) is not among the ids allowed
    store = harness.crash(store)  # both results were durable when the calls returned
    assert {k: v for k, v in store.status().counts.items() if v} == {
        "done": 1,
        "failed": 1,
        "pending": 1,
    }


def test_finish_and_claim_on_a_paused_queue_records_and_claims_nothing(harness: Harness) -> None:
    store = harness.open()
    store.enqueue(["a", "b"])
    runner = new_runner()
    first = store.claim(runner)
    assert first is not None
    store.set_paused(True)
    state, nxt = store.finish_and_claim(first, OK, runner=runner)
    assert (state, nxt) == (ItemState.DONE, None)
    assert store.status().counts["pending"] == 1


# -- the journal store: one locked section, one fsync, no needless read ------------


class CountingStore(JournalStore):
    locks = 0
    reads = 0

    def _locked(self):  # type: ignore[no-untyped-def]  # the parent's context manager
        CountingStore.locks += 1
        return super()._locked()

    def _catch_up(self) -> None:
        CountingStore.reads += 1
        super()._catch_up()


def test_journal_store_fuses_finish_and_claim_into_one_locked_section(tmp_path: Path) -> None:
    fsyncs: list[int] = []
    store = CountingStore(tmp_path / "q", create=True, ops=_Counting(fsyncs))
    store.enqueue([str(i) for i in range(5)])
    runner = new_runner()
    claim = store.claim(runner)
    CountingStore.locks = 0
    fsyncs.clear()
    done = 0
    while claim is not None:
        _, claim = store.finish_and_claim(claim, OK, runner=runner)
        done += 1
    assert done == 5
    assert CountingStore.locks == 5, "one locked section per result and next claim"
    assert len(fsyncs) == 5, "one fsync per result, shared with the next start record"
    store.close()


def test_journal_store_reads_only_what_others_appended(tmp_path: Path) -> None:
    mine = CountingStore(tmp_path / "q", create=True)
    other = JournalStore(tmp_path / "q", create=False)
    try:
        mine.enqueue(["a"])
        CountingStore.reads = 0
        mine.status()
        mine.status()
        assert CountingStore.reads == 0, "its own records were applied as written"
        other.enqueue(["b"])
        assert mine.status().total == 2  # another process appended: read
        assert CountingStore.reads == 1
    finally:
        other.close()
        mine.close()


class _Counting(FileOps):
    """The real file operations, noting each fsync."""

    def __init__(self, seen: list[int]) -> None:
        self.seen = seen

    def fsync(self, fd: int) -> None:
        self.seen.append(fd)
        super().fsync(fd)


def _fused_workload(store: JournalStore, acked: set[str]) -> None:
    store.enqueue(["a", "b", "c", "d"])
    acked.update({"enq:a", "enq:b", "enq:c", "enq:d"})
    runner = new_runner()
    store.register_runner(runner)
    claim = store.claim(runner)
    while claim is not None:
        item = claim.item
        outcome = OK if item != "c" else Outcome(ok=False, reason="boom")
        state, claim = store.finish_and_claim(claim, outcome, runner=runner)
        acked.add(f"{state.value}:{item}")


def _seen(store: JournalStore) -> set[str]:
    out = {f"enq:{v.item}" for v in store.items()}
    out.update(f"{r.state.value}:{r.item}" for r in store.results())
    return out


def test_power_cut_anywhere_in_fused_finish_and_claim_keeps_acknowledged_results(
    tmp_path: Path,
) -> None:
    counting = tmp_path / "count"
    JournalStore(counting, create=True).close()
    ops = PowerLossOps(counting)
    store = JournalStore(counting, create=False, ops=ops)
    _fused_workload(store, set())
    store.close()
    for k, tail in itertools.product(range(1, ops.ops + 1), ("drop", "torn", "garble")):
        folder = tmp_path / f"k{k}-{tail}"
        JournalStore(folder, create=True).close()
        cut = PowerLossOps(folder, cut_at=k)
        acked: set[str] = set()
        store = JournalStore(folder, create=False, ops=cut)
        with pytest.raises(PowerCut):
            _fused_workload(store, acked)
        contents = cut.after_cut(Variant(tail=tail, lose_renames=True, seed=k))
        store.close()
        apply_cut(folder, contents)
        again = JournalStore(folder, create=False)
        try:
            assert not acked - _seen(again), (k, tail, acked - _seen(again))
        finally:
            again.close()


def test_killed_at_every_fsync_of_a_run_no_result_is_lost_or_skipped(
    sq_env: dict[str, str], tmp_path: Path
) -> None:
    n = 2

    def once(k: int) -> bool:
        home = tmp_path / f"fsync{k}"
        env = dict(sq_env, STATEQUEUE_HOME=str(home))
        log = tmp_path / f"fsync{k}.log"
        with Queue("q", home=home) as q:  # untimed setup: the sweep is over the run's fsyncs
            q.enqueue([str(i) for i in range(n)])
        worker = ["sh", "-c", f'echo "$0" >> {log}', "{}"]
        first = sq(env, "-q", "q", "run", "--no-live", "--", *worker, crash=f"fsync:{k}")
        crashed = first.returncode == -signal.SIGKILL
        acked = {line.split()[2] for line in first.stderr.splitlines() if line.startswith("[ok]")}
        if crashed:
            rest = sq(env, "-q", "q", "run", "--no-live", "--", *worker)
            assert rest.returncode in (0, 3), rest.stderr
        else:
            assert first.returncode == 0, first.stderr
        with Queue("q", home=home) as q:
            done = {r.item for r in q.results(ItemState.DONE)}
            assert q.status().counts[ItemState.RUNNING] == 0
        assert done == {str(i) for i in range(n)}
        assert acked <= done
        runs = log.read_text().split()
        assert len(runs) - n <= (1 if crashed else 0), runs
        return crashed

    assert sweep(once) >= n  # a kill at each item's fsync at least


# -- the runner: a claim taken along with a result, never left dangling --------------


def test_a_claim_taken_with_the_last_result_goes_back_when_the_run_stops(
    sq_home: Path,
) -> None:
    with Queue("q", home=sq_home) as q:
        q.enqueue(["a", "b", "c"])
        runner = Runner(q, RunOptions(command=("true",)))
        record_batch = runner.recorder.record_batch

        def stop_after_first(*args: Any, **kwargs: Any) -> None:
            # A signal that comes right after a's result (and b's claim) is durable.
            record_batch(*args, **kwargs)
            runner.request_stop(signal.SIGTERM)

        runner.recorder.record_batch = stop_after_first  # type: ignore[method-assign]
        summary = runner.run()
        views = {v.item: v for v in q.items()}
        history = q.history(2)
    assert summary.attempts == 1
    assert views["a"].state is ItemState.DONE
    # b was claimed along with a's result, then given back unstarted: pending,
    # no attempt counted (it must not look like a runner crash).
    assert [e["t"] for e in history.events] == ["enq", "start", "intr"]
    assert views["b"].state is views["c"].state is ItemState.PENDING
    with Queue("q", home=sq_home) as q:
        again = q.claim(new_runner())
    assert again is not None
    assert (again.item, again.attempt, again.interrupted) == ("b", 1, False)


def test_halt_on_failure_claims_nothing_along_with_a_result(sq_home: Path) -> None:
    with Queue("q", home=sq_home) as q:
        q.enqueue(["a", "b"])
        Runner(q, RunOptions(command=("false",), halt_on_failure=True)).run()
        assert [e["t"] for e in q.history(2).events] == ["enq"]


# -- the keeper: a bare program name found on PATH once per run ----------------------


def _tool(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(stat.S_IRWXU)
    return path


def test_find_program_follows_path_order_and_skips_what_cannot_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second, third = tmp_path / "1", tmp_path / "2", tmp_path / "3"
    (first / "tool").mkdir(parents=True)  # a folder of that name is skipped
    second.mkdir()
    (second / "tool").write_text("not executable")
    found = _tool(third, "tool", "exit 0")
    monkeypatch.setenv("PATH", os.pathsep.join(map(str, (first, second, third))))
    assert find_program("tool") == str(found)
    assert find_program("no-such-tool") == ""


def test_keeper_looks_again_when_the_program_it_found_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    early, late = tmp_path / "early", tmp_path / "late"
    out = tmp_path / "out"
    gone = _tool(early, "tool", f"echo early >> {out}")
    _tool(late, "tool", f"echo late >> {out}")
    monkeypatch.setenv("PATH", f"{early}{os.pathsep}{late}")
    mine, theirs = socket.socketpair()
    try:
        keeper = KeeperProcess(theirs, "q")
        for _ in range(2):
            pid = keeper.start(["tool"], dict(os.environ), [])
            assert os.waitpid(pid, 0)[1] == 0
            if gone.exists():
                gone.unlink()  # the path found first is gone: PATH decides again
    finally:
        mine.close()
        theirs.close()
    assert out.read_text().split() == ["early", "late"]


# -- the progress bar: at most ~10 updates a second of the item it names -------------


def test_progress_bar_names_the_started_item_at_most_ten_times_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from statequeue.cli import progress
    from statequeue.run.events import ItemStarted

    clock = [1000.0]
    monkeypatch.setattr(progress, "monotonic", lambda: clock[0])
    view = progress.RichView(total=300)
    named: list[object] = []
    real_update = view.progress.update
    monkeypatch.setattr(
        view.progress, "update", lambda task, **kw: (named.append(kw), real_update(task, **kw))
    )
    try:
        with Queue("q") as q:
            q.enqueue(["a"])
            claim = q.claim(new_runner())
        assert claim is not None
        for _ in range(200):  # 200 starts within 0.1 s: the bar names one
            view.handle(ItemStarted(claim))
            clock[0] += 0.0004
        clock[0] += 0.1
        view.handle(ItemStarted(claim))  # the next one, a tenth of a second later
    finally:
        view.close()
    assert len(named) == 2


def test_the_pipes_made_ahead_are_closed_with_the_run(sq_home: Path) -> None:
    # -j1 makes the next child's output pipes once a child is started
    # (pipes.PipeStock): none may be left open after the run.
    before = set(os.listdir("/proc/self/fd"))
    with Queue("q", home=sq_home) as q:
        q.enqueue(["a", "b", "c"])
        runner = Runner(q, RunOptions(command=("true",)))
        assert runner.spec.pipes is not None
        summary = runner.run()
    assert summary.attempts == 3
    assert set(os.listdir("/proc/self/fd")) == before


def test_a_signal_during_a_claim_gives_the_item_back_unstarted(sq_home: Path) -> None:
    """A stop that comes while the runner claims its next item (outside tester:
    "3 handed back (stopped); 2 attempts started"): the item was never started,
    so it goes back as if never claimed, no attempt counted, and the summary
    does not count it as handed back."""
    with Queue("q", home=sq_home) as q:
        q.enqueue(["a", "b"])
        runner = Runner(q, RunOptions(command=("true",)))
        claim = q.claim

        def stopped_while_claiming(*args: Any, **kwargs: Any) -> Any:
            taken = claim(*args, **kwargs)
            runner.request_stop(signal.SIGTERM)
            return taken

        q.claim = stopped_while_claiming  # type: ignore[method-assign]
        summary = runner.run()
        views = {v.item: v for v in q.items()}
        history = q.history(1)
    assert (summary.attempts, summary.released) == (0, 0)
    assert "handed back" not in summary.text()
    assert views["a"].state is ItemState.PENDING and views["a"].attempts == 0
    assert [e["t"] for e in history.events] == ["enq", "start", "intr"]
    with Queue("q", home=sq_home) as q:
        again = q.claim(new_runner())
    assert again is not None
    assert (again.item, again.attempt, again.interrupted) == ("a", 1, False)
