"""Crash recovery for the record-based stores: items whose runner (and its
children) are gone are settled by the policy (store/transitions.py)."""

from __future__ import annotations

from collections.abc import Container

from statequeue.core.models import ItemState, OnInterrupted
from statequeue.core.records import Record
from statequeue.core.views import RecoveryReport
from statequeue.store import transitions
from statequeue.store.records.backend import RecordBackend, record_time
from statequeue.store.records.runners import RunnerRegistry
from statequeue.store.records.state import LiveItem, QueueState


class Recovery:
    """Applies the crash-recovery policy to one queue's interrupted items."""

    def __init__(self, backend: RecordBackend, runners: RunnerRegistry) -> None:
        self.backend = backend
        self.runners = runners

    def recover(
        self,
        state: QueueState,
        policy: OnInterrupted,
        max_crashes: int,
        only: Container[int] | None = None,
    ) -> RecoveryReport:
        """Settle every running item (of ``only``, if given) whose claim no
        live process holds (the caller holds the lock); runs with every
        claim, so it is cheap when nothing died."""
        report = RecoveryReport()
        # Hosts of the runners, taken before the dead ones are forgotten: an
        # attempt that died with its runner names both (for `stats`). Copied
        # as they are (this runs with every claim); read only for a recovery.
        hosts = dict(state.runners)
        self.runners.prune_dead(state)
        alive = state.runners  # pruned: only the live ones are left
        for item in state.running():
            if only is not None and item.id not in only:
                continue
            if kept_by_keeper(state, item, alive) or not self.backend.claim_free(item):
                continue
            if item.checking:  # only its --verify check ran: not an attempt, no crash
                rec = transitions.check_interrupted_record(
                    item.id, item.attempts, crashed=item.interrupted, at=record_time()
                )
                rec["runner"] = item.runner
                self.backend.write([rec], sync=False)
                report.retried.append(item.id)
                continue
            why = f"interrupted: its runner died during attempt {item.attempts}"
            # The runner that died (for `stats`).
            rec, target = crash_record(item, item.runner, policy, max_crashes, why)
            host = str(hosts.get(item.runner, {}).get("host", ""))
            if host:
                rec["host"] = host
            self.backend.write([rec], sync=False)
            transitions.recovery_bucket(report, target).append(item.id)
        return report


def kept_by_keeper(state: QueueState, item: LiveItem, alive: Container[str]) -> bool:
    """Whether ``item`` is still its runner's: a guarded runner's liveness
    lock is held by its keeper after its death until no process it left is
    alive, so its items wait for that, even those whose last process closed
    its claim fd (run/guard.py). ``alive``: the ids of live runners."""
    if item.runner not in alive:
        return False
    rec = state.runners.get(item.runner)
    return rec is not None and bool(rec.get("guard"))


def crash_record(
    item: LiveItem, runner: str, policy: OnInterrupted, max_crashes: int, interrupted: str
) -> tuple[Record, ItemState]:
    """The ``intr`` record that settles ``item``'s attempt, which died with a
    process of it (its runner, or a persistent worker: ``interrupted`` says
    which), and the state it moves to: one more crash, then the policy
    (poison after ``max_crashes``)."""
    crashes = item.crashes + 1
    target = transitions.recovery_state(policy, crashes, max_crashes)
    reason = transitions.recovery_reason(target, policy, crashes, interrupted=interrupted)
    crashed = transitions.recovered_crashed(target)
    rec = transitions.interrupted_record(
        item.id, item.attempts, target, reason, crashed=crashed, at=record_time()
    )
    rec["crashes"] = crashes
    rec["runner"] = runner
    if item.started:  # the report draws the attempt from its start to this recovery
        rec["started"] = item.started
    return rec, target
