"""A run's entry in the store, from its start to its end.

Before its first claim a run registers itself (``--single`` refuses a second
runner), hands its liveness lock to the keeper when a guard started it (the
keeper holds it until every process the run leaves is gone: promise 4),
finds whether the queue was last run with another command, and reports what
recovery found of an earlier run. At its end it unregisters: a store that
cannot be reached then marks it stopped once its pid or lease is seen gone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from statequeue.api.queue import Queue
from statequeue.core.errors import StoreUnreachable
from statequeue.core.models import RunnerInfo
from statequeue.run.checks import command_drift, report_recovery, unpaced_note
from statequeue.run.events import Notice, RunEvent, RunSummary
from statequeue.run.guard import GuardLink
from statequeue.run.options import RunOptions
from statequeue.run.outage import OUTAGE_SLICE
from statequeue.run.verify import VERIFY_NAMES_NO_ITEM, names_item
from statequeue.store.base import Store

__all__ = ["register_run", "unregister_run"]


def register_run(
    queue: Queue,
    info: RunnerInfo,
    options: RunOptions,
    guard: GuardLink | None,
    on_event: Callable[[RunEvent], None],
    summary: RunSummary,
) -> str:
    """Register the run in ``queue``'s store and report recovery (unregistered
    again if that fails); the items recovery failed or held count in ``summary``.
    Returns the warning that the queue was last run with another command (""
    if not), for the run to say once it starts an attempt: a run with nothing
    to do runs no command, and records none (``Store.commands``)."""
    store = queue.store
    if options.lease is not None:
        store.use_lease(options.lease)
    store.use_patience(OUTAGE_SLICE)  # outages are ridden out by the loop (runner: _ride_out)
    earlier = store.commands()
    store.register_runner(info, exclusive=options.single)
    if guard is not None:  # held by the keeper too, until all we leave is gone
        guard.send_liveness(queue.name, store.liveness_fds(info.runner_id))
        guard.send_note(store.leftover_note(info.runner_id))
    drift = command_drift(earlier, options.shown_command, options.command)
    if options.verify and not names_item(options.verify):
        on_event(Notice(VERIFY_NAMES_NO_ITEM, warning=True))
    if options.rate is None and (pace := store.pace()) is not None:
        on_event(Notice(unpaced_note(pace)))
    try:
        report = report_recovery(
            store,
            options.recovery_policy,
            options.max_crashes,
            bool(options.verify),
            on_event,
            asked=options.on_interrupted,
        )
    except BaseException:
        store.unregister_runner(info.runner_id)
        raise
    summary.recovered(report)
    return drift


def unregister_run(store: Store, info: RunnerInfo) -> None:
    """The run's end in the store (unreachable: its row is marked stopped
    once its pid or lease is seen gone)."""
    with contextlib.suppress(StoreUnreachable):
        store.unregister_runner(info.runner_id)
