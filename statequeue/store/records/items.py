"""An item of the replayed state: one state byte per item id, and for an
item that is not done yet and has details (started, failed, held, cancelled,
retried) a ``LiveItem``; a fresh pending item gets one only when it is used.
"""

from __future__ import annotations

from collections.abc import Callable

from statequeue.core.models import ItemState

PENDING = ItemState.PENDING
RUNNING = ItemState.RUNNING
DONE = ItemState.DONE
FAILED = ItemState.FAILED
CANCELLED = ItemState.CANCELLED
HELD = ItemState.HELD

# One byte per item id; 0 means no such item.
CODE = {PENDING: 1, RUNNING: 2, DONE: 3, FAILED: 4, CANCELLED: 5, HELD: 6}
STATE_OF: tuple[ItemState | None, ...] = (None, PENDING, RUNNING, DONE, FAILED, CANCELLED, HELD)
P_CODE = CODE[PENDING]
D_CODE = CODE[DONE]

TextLoader = Callable[[int, int], str]
"""Reads item ``id``'s text back from the store, given its record's locator."""


def no_text_loader(item_id: int, loc: int) -> str:
    raise LookupError(f"no text loader for record {loc}")


class LiveItem:
    """An item that is not done yet, with its details. Its text is read back
    from the store on first use (``loc`` locates the record that holds it)."""

    __slots__ = (
        "_load",
        "_text",
        "attempts",
        "checking",
        "crashes",
        "deferrals",
        "failures",
        "id",
        "interrupted",
        "last_err",
        "last_seq",
        "loc",
        "not_before",
        "reason",
        "runner",
        "started",
        "state",
    )

    def __init__(self, item_id: int, loc: int, load: TextLoader, text: str | None = None) -> None:
        self.id = item_id
        self.loc = loc
        self._load = load
        self._text = text
        self.state = PENDING
        self.attempts = 0
        self.crashes = 0
        # Failed attempts in the current episode, for `run --retries`. An
        # episode starts at enqueue, at a user's `retry`, and when a stopped
        # runner hands the item back; runner crashes (``crashes``) do not end one.
        self.failures = 0
        # Times it asked to be tried later in this episode (``--max-deferrals``).
        self.deferrals = 0
        self.runner = ""
        self.reason = ""
        self.last_seq = 0
        self.interrupted = False  # its last attempt died with its runner
        self.last_err = ""  # the last stderr line of its last unsuccessful attempt
        self.not_before = 0.0  # wall-clock time before which a retry must wait
        self.checking = False  # its running attempt is only a --verify check so far
        self.started = 0.0  # when its running attempt started (0: not known)

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = self._load(self.id, self.loc)
        return self._text


def id_runs(marks: bytes | bytearray, mark: int) -> list[list[int]]:
    """[first, last] runs of the ids (indexes from 1 on) whose byte in
    ``marks`` is ``mark``: found in C, one byte per id."""
    other = 1 - mark
    out: list[list[int]] = []
    found = marks.find(mark, 1)
    while found >= 0:
        end = marks.find(other, found)
        end = len(marks) if end < 0 else end
        out.append([found, end - 1])
        found = marks.find(mark, end)
    return out
