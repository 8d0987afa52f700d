"""The runners' side of every record-based store: registering runners,
and what ``status``, ``list`` and ``show`` ask about them (who is alive,
which running items a dead runner left, interrupted or still held by its
processes, and their hosts). Kept apart from record_store.py, which holds
the writes (claims, results, recovery)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Collection
from dataclasses import replace

from statequeue.core.models import RunnerInfo
from statequeue.core.views import ActiveRunner, Status
from statequeue.store.records.record_reads import RecordReads
from statequeue.store.records.recovery import kept_by_keeper
from statequeue.store.records.runners import RunnerRegistry
from statequeue.store.records.state import LiveItem, QueueState


class RecordRunners(RecordReads):
    """Runner registration and the views of runners over a ``QueueState``."""

    _registry: RunnerRegistry

    @abstractmethod
    def _claim_free(self, item: LiveItem) -> bool:
        """True when no live process (runner or its children) holds ``item``'s claim."""

    def register_runner(self, runner: RunnerInfo, *, exclusive: bool = False) -> None:
        self._registry.register(runner, exclusive=exclusive)

    def unregister_runner(self, runner_id: str) -> None:
        self._registry.unregister(runner_id)

    def active_runners(self) -> list[ActiveRunner]:
        with self._locked() as state:
            return self._registry.active(state)

    def prune_dead_runners(self, state: QueueState) -> None:
        """Record that runners which died without unregistering are gone
        (the caller holds the lock: compaction does it before a snapshot)."""
        self._registry.prune_dead(state)

    def status(self) -> Status:
        from statequeue.store.records.listing import status_view  # lazy: start-up time

        with self._locked() as state:
            active = self._registry.active(state)
            interrupted, held = self._left_by_dead_runners(state, active)
            found = status_view(self.name, state, active, interrupted)
        return replace(found, held_by_dead_runner=held) if held else found

    def interrupted(self) -> tuple[int, ...]:
        with self._locked() as state:
            return self._left_by_dead_runners(state, self._registry.active(state))[0]

    def held_by_dead_runner(self) -> tuple[int, ...]:
        with self._locked() as state:
            return self._left_by_dead_runners(state, self._registry.active(state))[1]

    def _left_by_dead_runners(
        self, state: QueueState, active: list[ActiveRunner]
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The running items ``status`` lists as interrupted (no live runner
        keeps them, ``active`` being the live ones, and no process holds their
        claim: the next run recovers them) and as held by a dead runner (their
        runner is not alive, but a process it left holds the claim), in id
        order; each claim probed once (the caller holds the lock)."""
        alive = {r.runner_id for r in active}
        interrupted: list[int] = []
        held: list[int] = []
        for i in state.running():
            kept, dead = kept_by_keeper(state, i, alive), i.runner not in alive
            if kept and not dead:
                continue
            free = self._claim_free(i)
            if not kept and free:
                interrupted.append(i.id)
            if dead and not free:
                held.append(i.id)
        return tuple(sorted(interrupted)), tuple(sorted(held))

    def runner_hosts(self, runner_ids: Collection[str]) -> dict[str, str]:
        with self._locked() as state:
            found = {r: state.runners.get(r, {}).get("host") for r in runner_ids}
        return {r: str(host) for r, host in found.items() if host}

    def commands(self) -> list[list[str]]:
        """Command templates of earlier runs, oldest first (consecutive repeats merged)."""
        with self._locked() as state:
            return [list(c) for c in state.commands]
