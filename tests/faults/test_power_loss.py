"""Simulated power cuts at every operation of enqueue, run and compact.

After each cut, the files hold what a real disk could hold (unsynced bytes
dropped, kept, torn or garbled; unsynced renames lost or not). The queue must
open (or refuse clearly, never as empty), and every result acknowledged before
the cut must be there.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from statequeue.core.errors import DamagedState
from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from statequeue.store.journal.store import JournalStore
from tests.faults.powerloss import PowerCut, PowerLossOps, Variant, apply_cut

TAILS = ("drop", "keep", "torn", "garble")
CUTS = {"points": 0, "states": 0}


def workload(store: JournalStore, acked: set[str]) -> None:
    store.enqueue(["a", "b", "c", "d"])
    acked.update({"enq:a", "enq:b", "enq:c", "enq:d"})
    runner = new_runner()
    store.register_runner(runner)
    for _ in range(2):
        claim = store.claim(runner)
        assert claim is not None
        store.finish(claim, Outcome(ok=True, result=claim.item))
        acked.add(f"done:{claim.item}")
    store.compact()
    store.enqueue(["e"])
    acked.add("enq:e")
    claim = store.claim(runner)
    assert claim is not None
    store.finish(claim, Outcome(ok=False, reason="boom"))
    acked.add(f"failed:{claim.item}")
    store.compact()


def seen(store: JournalStore) -> set[str]:
    out = {f"enq:{v.item}" for v in store.items()}
    for r in store.results():
        out.add(f"{r.state.value}:{r.item}")
    return out


def prepared(folder: Path) -> None:
    store = JournalStore(folder, create=True)
    store.close()


def count_ops(tmp_path: Path) -> int:
    folder = tmp_path / "count"
    prepared(folder)
    ops = PowerLossOps(folder)
    store = JournalStore(folder, create=False, ops=ops)
    workload(store, set())
    store.close()
    return ops.ops


def test_power_cut_at_every_operation(tmp_path: Path) -> None:
    total = count_ops(tmp_path)
    assert total > 20
    for k, tail, lose in itertools.product(range(1, total + 1), TAILS, (False, True)):
        folder = tmp_path / f"k{k}-{tail}-{lose}"
        prepared(folder)
        ops = PowerLossOps(folder, cut_at=k)
        acked: set[str] = set()
        store = JournalStore(folder, create=False, ops=ops)
        with pytest.raises(PowerCut):
            workload(store, acked)
        contents = ops.after_cut(Variant(tail=tail, lose_renames=lose, seed=k))
        store.close()
        apply_cut(folder, contents)
        CUTS["points"] += 1
        try:
            again = JournalStore(folder, create=False)
        except DamagedState as exc:  # allowed only as a clear refusal, never silently empty
            pytest.fail(f"cut at op {k} ({tail}, lose_renames={lose}) refused: {exc}")
        try:
            missing = acked - seen(again)
            assert not missing, (k, tail, lose, missing)
            if acked:
                assert again.status().total > 0
            again.enqueue(["after"])  # usable
        finally:
            again.close()
        CUTS["states"] += 1
