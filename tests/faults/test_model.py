"""Model-based test: random sequences of enqueue, claim, finish, fail, retry,
cancel, compact, power cut (unsynced writes dropped, torn or garbled) and
reopen, checked after every step against a plain in-memory model."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from statequeue.core.identity import new_runner
from statequeue.core.models import Claim, Outcome
from statequeue.store.journal.store import JournalStore
from tests.faults.powerloss import PowerLossOps, Variant, apply_cut

ALPHABET = [f"item{i}" for i in range(12)]
NO_POISON = 10**6
SCRATCH = Path("/dev/shm") if Path("/dev/shm").is_dir() else None


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="sq-model-", dir=SCRATCH))
        self.folder = self.root / "q"
        JournalStore(self.folder, create=True).close()
        self.ops = PowerLossOps(self.folder)
        self.store = self.open_store()
        self.runner = new_runner()
        self.ids: dict[str, int] = {}
        self.model: dict[int, str] = {}
        self.claims: dict[int, Claim] = {}
        self.cuts = 0

    def open_store(self) -> JournalStore:
        return JournalStore(self.folder, create=False, ops=self.ops)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def in_state(self, state: str) -> list[int]:
        return sorted(i for i, s in self.model.items() if s == state)

    @rule(items=st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=4))
    def enqueue(self, items: list[str]) -> None:
        fresh = [t for t in dict.fromkeys(items) if t not in self.ids]
        result = self.store.enqueue(items)
        assert (result.added, result.skipped) == (len(fresh), len(items) - len(fresh))
        for text in fresh:
            item_id = len(self.ids) + 1
            self.ids[text] = item_id
            self.model[item_id] = "pending"

    @rule()
    def claim(self) -> None:
        pending = self.in_state("pending")
        claim = self.store.claim(self.runner, max_crashes=NO_POISON)
        if not pending:
            assert claim is None
            return
        assert claim is not None and claim.item_id == pending[0]
        self.model[claim.item_id] = "running"
        self.claims[claim.item_id] = claim

    @precondition(lambda self: self.claims)
    @rule(ok=st.booleans(), data=st.data())
    def finish(self, ok: bool, data: st.DataObject) -> None:
        item_id = data.draw(st.sampled_from(sorted(self.claims)))
        claim = self.claims.pop(item_id)
        self.store.finish(claim, Outcome(ok=ok, result={"id": item_id}, reason="" if ok else "x"))
        self.model[item_id] = "done" if ok else "failed"

    @precondition(lambda self: any(s == "failed" for s in self.model.values()))
    @rule()
    def retry_failed(self) -> None:
        failed = self.in_state("failed")
        assert self.store.retry(failed) == failed
        for item_id in failed:
            self.model[item_id] = "pending"

    @precondition(lambda self: any(s == "pending" for s in self.model.values()))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        item_id = data.draw(st.sampled_from(self.in_state("pending")))
        assert self.store.cancel([item_id]) == [item_id]
        self.model[item_id] = "cancelled"

    @rule()
    def compact(self) -> None:
        self.store.compact()

    @rule(
        tail=st.sampled_from(["drop", "keep", "torn", "garble"]),
        lose_renames=st.booleans(),
        seed=st.integers(0, 2**16),
    )
    def power_cut_and_reopen(self, tail: str, lose_renames: bool, seed: int) -> None:
        contents = self.ops.after_cut(Variant(tail=tail, lose_renames=lose_renames, seed=seed))
        self.store.close()
        apply_cut(self.folder, contents)
        self.ops = PowerLossOps(self.folder)
        self.store = self.open_store()
        self.store.recover(max_crashes=NO_POISON)
        for item_id in self.claims:
            self.model[item_id] = "pending"  # in flight at the cut: recovered
        self.claims.clear()
        self.cuts += 1

    @invariant()
    def counts_match_the_model(self) -> None:
        counts = {k: v for k, v in self.store.status().counts.items() if v}
        expected: dict[str, int] = {}
        for state in self.model.values():
            expected[state] = expected.get(state, 0) + 1
        assert counts == expected

    @invariant()
    def every_acknowledged_result_is_kept(self) -> None:
        done = {r.item_id for r in self.store.results()}
        assert set(self.in_state("done")) | set(self.in_state("failed")) <= done


QueueMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)
TestQueueModel = QueueMachine.TestCase


class CheckpointingMachine(QueueMachine):
    """The same model with a state checkpoint after every change and on every
    close: a power cut then often leaves a checkpoint that is ahead of the
    journal (its records were never fsynced), which reopening must refuse."""

    def open_store(self) -> JournalStore:
        store = JournalStore(self.folder, create=False, ops=self.ops)
        store.settings.checkpoint_every = store.settings.checkpoint_on_close = 1
        return store


CheckpointingMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None
)
TestQueueModelWithCheckpoints = CheckpointingMachine.TestCase
