"""Kill loops: SIGKILL real `statequeue` processes at random moments, restart them,
and check the promises once the queue has run to its end.

- nothing skipped: every item ends done, and its work reached its last action;
- at most the in-flight items re-run: re-runs <= kills x jobs; with a --verify
  hook no item's work completes twice;
- never two copies of one item at once, even when the work outlives its runner;
- nothing acknowledged is lost: every item of an enqueue that reported success
  is still there after enqueue, compact and run were killed around it.

The machinery is in killloop.py (also behind scripts/killloop.py). The tests
here make >= 100 kills in all within `make test`; the `crash`-marked one makes
>= 1000 (`make test-crash`). Each prints its figures (`pytest -s` shows them);
a failure names the random seed: ``KILLLOOP_SEED`` replays the same random
choices (the timing of the processes still varies).

The test at the end pins down a statequeue bug found
with this machinery (now fixed: a regression test).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.killloop import Figures, Harness, Proc


def _seed() -> int | None:
    value = os.environ.get("KILLLOOP_SEED")
    return int(value) if value else None


MakeHarness = Callable[..., Harness]


@pytest.fixture
def make_harness(tmp_path: Path, sq_home: Path) -> Iterator[MakeHarness]:
    """Harness factory bound to this test's folders; closes every harness it made."""
    made: list[Harness] = []

    def factory(**kwargs: Any) -> Harness:
        h = Harness(tmp_path / f"loop{len(made)}", home=sq_home, seed=_seed(), **kwargs)
        made.append(h)
        return h

    yield factory
    for h in made:
        h.close()


def _report(label: str, fig: Figures, seed: int) -> None:
    print(f"\n{fig.line(label)} [seed {seed}]")


def test_kill_loop_single_runner(make_harness: MakeHarness) -> None:
    """200 items, one runner SIGKILLed >= 20 times at random moments, then run to the end:
    all 200 done, none skipped, re-runs <= kills."""
    h = make_harness(jobs=1)
    h.enqueue(200)
    h.kill_loop(kills=20, runners=1)
    fig = h.check()
    _report("single runner", fig, h.seed)
    assert fig.run_kills >= 20
    assert fig.items == 200
    assert fig.reruns <= fig.run_kills


def test_kill_loop_verify_never_completes_twice(make_harness: MakeHarness) -> None:
    """The same with --verify (has the item's work reached its last action?): an item
    whose work finished before its runner died is recorded done, not run again, so no
    item's work completes twice. Items killed mid-work may still start again."""
    h = make_harness(jobs=1, verify=True)
    h.enqueue(200)
    h.kill_loop(kills=20, runners=1)
    fig = h.check()
    _report("single runner, --verify", fig, h.seed)
    assert fig.run_kills >= 20
    assert fig.duplicates == 0, fig.line()


def test_kill_loop_concurrent_runners(make_harness: MakeHarness) -> None:
    """Three runners (-j2 each) share one queue; random ones are killed and restarted."""
    h = make_harness(jobs=2)
    h.enqueue(200)
    h.kill_loop(kills=30, runners=3, max_starts=3)
    fig = h.check()
    _report("3 runners -j2", fig, h.seed)
    assert fig.run_kills >= 30
    assert fig.overlaps == 0


def test_kill_loop_work_outlives_its_runner(make_harness: MakeHarness) -> None:
    """Promise 4 under fire: the work runs on in a background subshell after its runner
    is killed (holding the claim it inherited). No second copy may start while it lives,
    and with --verify none runs again once it has finished."""
    h = make_harness(jobs=2, orphans=True, verify=True, work=0.03)
    h.enqueue(150)
    h.kill_loop(kills=20, runners=2, max_starts=3)
    fig = h.check()
    _report("2 runners -j2, orphaned work, --verify", fig, h.seed)
    assert fig.run_kills >= 20
    assert fig.overlaps == 0
    assert fig.duplicates == 0, fig.line()


def test_kill_loop_enqueue_and_compact(make_harness: MakeHarness) -> None:
    """enqueue and compact are killed at random moments while two runners are killed
    too; after each kill the queue must open with every acknowledged item. Then
    `compact` is killed at each of its durable steps (the store's crash hook) and
    must leave the state unchanged."""
    h = make_harness(jobs=2, max_items=300)
    h.enqueue(100)

    def after_kill(proc: Proc) -> None:
        if proc.role != "run":
            h.open_check()

    h.kill_loop(kills=25, runners=2, admin=True, admin_kills=4, on_kill=after_kill)
    h.crash_point_sweep()
    fig = h.check()
    _report("enqueue + compact + 2 runners", fig, h.seed)
    assert fig.enqueue_kills >= 4 and fig.compact_kills >= 4, fig.line()
    kinds = {point.split(":")[0] for point in fig.extra["crash_points"]}
    assert kinds == {"write", "fsync", "rename", "dirfsync"}, fig.extra["crash_points"]


@pytest.mark.crash
@pytest.mark.timeout(1800)
def test_kill_loop_torture(make_harness: MakeHarness) -> None:
    """>= 1000 kills across enqueue, run (two runners, -j2, --verify) and compact."""
    h = make_harness(jobs=2, verify=True, work=0.005, max_items=3000)
    h.enqueue(300)

    def after_kill(proc: Proc) -> None:
        if proc.role != "run":
            h.open_check()

    h.kill_loop(
        kills=1000, runners=2, admin=True, admin_kills=100, on_kill=after_kill, max_seconds=1500
    )
    h.crash_point_sweep()
    fig = h.check()
    _report("torture", fig, h.seed)
    assert fig.kills >= 1000
    assert fig.enqueue_kills >= 100 and fig.compact_kills >= 100, fig.line()
    assert fig.duplicates == 0, fig.line()


# -- regressions for bugs the kill loops found --------------------------------------


def test_list_after_compact_killed_before_its_rename(make_harness: MakeHarness) -> None:
    h = make_harness(jobs=1)
    h.enqueue(2)
    h.run_to_completion()
    assert h.cli("compact")[0] == 0  # the archive now holds items 1 and 2
    h.enqueue(2)
    h.run_to_completion()
    code, _ = h.cli("compact", crash="rename:1")  # items 3, 4 appended; no rename
    assert code == -9
    assert h.counts()["done"] == 4
    ids = [json.loads(line)["id"] for line in h.cli("list", "--json")[1].splitlines()]
    assert ids == [1, 2, 3, 4]
