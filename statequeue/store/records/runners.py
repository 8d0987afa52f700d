"""The runners of a record-based store: registering them, listing the live
ones, and recording that dead ones are gone."""

from __future__ import annotations

import os
from collections.abc import Callable

from statequeue.core.errors import RunnerActive
from statequeue.core.identity import host_name
from statequeue.core.models import RunnerInfo
from statequeue.core.process_state import stopped_since
from statequeue.core.views import ActiveRunner, WorkerView
from statequeue.store import transitions
from statequeue.store.records.backend import RecordBackend, record_time
from statequeue.store.records.state import QueueState


class RunnerRegistry:
    """The ``run`` and ``stop`` records of one queue's runners."""

    def __init__(
        self,
        backend: RecordBackend,
        *,
        workers: Callable[[str], tuple[WorkerView, ...]] = lambda runner_id: (),
    ) -> None:
        self.backend = backend
        self._workers = workers  # what a live runner published (Store.published_workers)

    def register(self, runner: RunnerInfo, *, exclusive: bool) -> None:
        """Record ``runner``; RunnerActive if ``exclusive`` and another is alive."""
        backend = self.backend
        with backend.locked() as state:
            others = [r for r in self.active(state) if r.runner_id != runner.runner_id]
            if exclusive and others:
                r = others[0]
                raise RunnerActive(
                    f"another runner is active on queue {backend.name!r} "
                    f"(pid {r.pid} on {r.host}); not starting"
                )
            backend.write([transitions.runner_record(runner)], sync=False)

    def unregister(self, runner_id: str) -> None:
        """Record that the runner stopped."""
        with self.backend.locked():
            stopped = transitions.runner_stopped_record(runner_id, at=record_time())
            self.backend.write([stopped], sync=True)

    def active(self, state: QueueState) -> list[ActiveRunner]:
        """The live runners, with the items each is running (caller holds the lock)."""
        running: dict[str, list[int]] = {}
        for item in state.running():
            running.setdefault(item.runner, []).append(item.id)
        alive = [(rid, rec) for rid, rec in state.runners.items() if self.backend.runner_alive(rid)]
        here = host_name() if alive else ""
        return [
            ActiveRunner(
                runner_id=rid,
                pid=rec.get("pid", 0),
                host=rec.get("host", ""),
                started_at=rec.get("since", 0.0),
                running=tuple(sorted(running.get(rid, ()))),
                workers=self._workers(rid),
                # Its lock may be held by its keeper or a leftover after it
                # died, and its pid given to another: stopped_since tells.
                stopped=rec.get("host") == here
                and stopped_since(rec.get("pid", 0), float(rec.get("since", 0.0))),
            )
            for rid, rec in alive
        ]

    def prune_dead(self, state: QueueState) -> None:
        """Record that runners which died without unregistering are gone, so
        their records are not carried forever (nor probed on every claim)."""
        backend = self.backend
        for rid in [r for r in state.runners if not backend.runner_alive(r)]:
            lost = transitions.runner_lost_record(rid, at=record_time(), by=os.getpid())
            backend.write([lost], sync=False)
            backend.forget_runner(rid)
