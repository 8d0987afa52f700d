"""The journal store's tunables: how often it checkpoints, when it compacts on
its own and how long it waits for the queue lock.

Read from the environment once, when a store opens. The store and the
objects it holds (replay, dedupe keys, stats summary, compaction) share one
``JournalSettings``, so a test that changes one on an open store
(``store.settings.checkpoint_every = 1``) changes it for every part.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from statequeue.core.errors import UsageError
from statequeue.store.journal.locks import lock_timeout

AUTO_COMPACT_ENV = "STATEQUEUE_AUTO_COMPACT"
DEFAULT_AUTO_COMPACT = 100_000
CHECKPOINT_ENV = "STATEQUEUE_CHECKPOINT_EVERY"
CHECKPOINT_EVERY = 20_000
CHECKPOINT_ON_CLOSE = 1_000


@dataclass
class JournalSettings:
    """One store's settings (mutable: see the module docstring)."""

    checkpoint_every: int  # records between state checkpoints; 0: no caches at all
    checkpoint_on_close: int  # new records that make a checkpoint worth writing at the end
    auto_compact: int  # dead records that start a background compaction; 0: never
    lock_limit: float  # seconds to wait for the queue lock

    @classmethod
    def from_environment(cls, *, auto_compact: int | None = None) -> JournalSettings:
        """The settings the environment asks for (``auto_compact`` overrides its own)."""
        every = checkpoint_threshold()
        limit = lock_timeout()  # read in this order: the first bad one is the one reported
        return cls(
            checkpoint_every=every,
            checkpoint_on_close=min(CHECKPOINT_ON_CLOSE, every),
            auto_compact=auto_compact_threshold() if auto_compact is None else auto_compact,
            lock_limit=limit,
        )

    @property
    def caches(self) -> bool:
        """Whether the caches (state, keys, stats) are written and used."""
        return self.checkpoint_every > 0


def compaction_due(lines: int, live: int, runners: int, limit: int) -> bool:
    """Whether a journal ``lines`` long, holding ``live`` items not done and
    ``runners`` runner records, is due for a background compaction: its dead
    records (all beyond one per live item and runner) reach ``limit`` (0:
    never) and outnumber the live ones, which keeps replay and appends cheap
    however long the history grows."""
    dead = lines - live - runners - 1
    return limit > 0 and dead >= limit and dead > live


def auto_compact_threshold() -> int:
    """Dead records that trigger automatic compaction: $STATEQUEUE_AUTO_COMPACT
    (0 or "off" disables it), default 100,000."""
    return _records_setting(AUTO_COMPACT_ENV, DEFAULT_AUTO_COMPACT)


def checkpoint_threshold() -> int:
    """Records between state checkpoints: $STATEQUEUE_CHECKPOINT_EVERY
    (0 or "off": neither written nor used), default 20,000 (or an eighth of
    the items, whichever is more)."""
    return _records_setting(CHECKPOINT_ENV, CHECKPOINT_EVERY)


def _records_setting(name: str, default: int) -> int:
    """A count of records from environment variable ``name``: "on" or unset for
    ``default``, 0 or "off" for none. A negative count is refused as "abc" and
    "1.5" are (it was taken as 0, turning the feature off without a word)."""
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("", "on"):
        return default
    if raw in ("0", "off", "no", "false"):
        return 0
    try:
        records = int(raw)
    except ValueError:
        records = -1
    if records < 0:
        raise UsageError(f"{name} must be a whole number of records >= 0, or off, not {raw!r}")
    return records
