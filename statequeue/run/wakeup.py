"""How a `run --follow` runner learns of new work: its store's wake-up fd
(PostgreSQL: LISTEN/NOTIFY) watched in the runner's selector, and a poll
every ``follow_poll()`` seconds as the fallback."""

from __future__ import annotations

import os
import selectors

from statequeue.core.errors import UsageError
from statequeue.store.base import Store

FOLLOW_POLL_ENV = "STATEQUEUE_FOLLOW_POLL"
DEFAULT_FOLLOW_POLL = 0.25


def follow_poll() -> float:
    """Seconds between a follower's looks for new items: $STATEQUEUE_FOLLOW_POLL,
    default 0.25. A store that wakes its followers (PostgreSQL) makes a long
    poll cheap: it is then only the fallback for a lost notify."""
    raw = os.environ.get(FOLLOW_POLL_ENV, "").strip()
    if not raw:
        return DEFAULT_FOLLOW_POLL
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.01 <= value <= 86400:
        raise UsageError(f"{FOLLOW_POLL_ENV} must be seconds between 0.01 and 86400, not {raw!r}")
    return value


class StoreWake:
    """The store's wake-up fd, registered in a selector under ``tag`` while it lives."""

    def __init__(self, store: Store, selector: selectors.BaseSelector, tag: object) -> None:
        self.store = store
        self.selector = selector
        self.tag = tag
        self.fd: int | None = None

    def watch(self) -> None:
        """Watch the store's fd, if it has one and it is not watched yet."""
        if self.fd is None:
            self.fd = self.store.wake_fd()
            if self.fd is not None:
                self.selector.register(self.fd, selectors.EVENT_READ, self.tag)

    def woke(self) -> None:
        """The fd is readable: consume it; stop watching a dead one."""
        if not self.store.drain_wake():
            self.close()

    def close(self) -> None:
        if self.fd is not None:
            self.selector.unregister(self.fd)
            self.fd = None
