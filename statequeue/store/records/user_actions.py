"""The user's actions on a record-based store: retry, cancel, pause. Which
states each accepts, and the refusals, are the store's transitions."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from statequeue.core.models import ItemState
from statequeue.store import transitions
from statequeue.store.records.backend import RecordBackend, record_time
from statequeue.store.records.state import QueueState


class UserActions:
    """A user's state changes on one queue, each one durable append."""

    def __init__(self, backend: RecordBackend) -> None:
        self.backend = backend

    def retry(self, ids: Sequence[int] | None, states: Collection[ItemState]) -> list[int]:
        """Move the items (``ids``, or every one in ``states``) back to pending."""
        allowed = transitions.retry_allowed(ids, states)
        return self.set_state(ids, ItemState.PENDING, allowed, "retry")

    def cancel(self, ids: Sequence[int]) -> list[int]:
        """Cancel the items, after checking every one."""
        return self.set_state(ids, ItemState.CANCELLED, transitions.CANCELLABLE, "cancel")

    def set_paused(self, paused: bool) -> None:
        with self.backend.locked():
            self.backend.write([transitions.pause_record(paused, at=record_time())], sync=True)

    def set_state(
        self,
        ids: Sequence[int] | None,
        target: ItemState,
        allowed: tuple[ItemState, ...],
        verb: str,
    ) -> list[int]:
        """Move the items (``ids``, or every one in ``allowed``) to ``target``,
        after checking every one (ItemNotFound or UsageError, nothing changed)."""
        with self.backend.locked() as state:
            if ids is None:
                chosen = [i for i in state.live_ids() if state.state_of(i) in allowed]
            else:
                chosen = list(dict.fromkeys(ids))
                for item_id in chosen:
                    self._check(state, item_id, allowed, verb)
            at = record_time()
            records = [transitions.user_record(i, target, verb, at=at) for i in chosen]
            self.backend.write(records, sync=True)
            return chosen

    def _check(
        self, state: QueueState, item_id: int, allowed: tuple[ItemState, ...], verb: str
    ) -> None:
        item = state.get(item_id)
        if item is None:
            if 0 < item_id < state.next_id:
                transitions.check_allowed(verb, item_id, "done", allowed)
            raise transitions.unknown_item(item_id, self.backend.name)
        transitions.check_allowed(verb, item_id, item.state.value, allowed)
