"""What `compact` and `fsck` report back (re-exported by ``views``, which
loads this module only when one of them is first used)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from statequeue.core.models import STATUS_SCHEMA


@dataclass(frozen=True)
class CompactResult:
    """Sizes of the journal before and after compaction, and what was archived."""

    bytes_before: int
    bytes_after: int
    archived: int
    archive_bytes: int
    rows_moved: int | None = None
    """Rows moved to the archive tables (a PostgreSQL store; None for the journal)."""
    logs_removed: LogsRemoved = field(default_factory=lambda: LogsRemoved())
    """The logs of archived items removed after it (``compact --keep-logs``)."""


@dataclass(frozen=True)
class LogsRemoved:
    """Log files of archived items that compaction removed, and their bytes."""

    files: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class CountMismatch:
    """A state whose maintained counter disagrees with a recount of the items."""

    state: str
    counted: int
    """What the counters say (what `status` shows)."""
    recounted: int
    """What the items' rows say."""


@dataclass(frozen=True)
class StoreCheck:
    """What `fsck` found in a store that keeps counters (PostgreSQL)."""

    queue: str
    counts: dict[str, int]
    """Items per state, recounted from the rows."""
    mismatches: tuple[CountMismatch, ...] = ()
    repaired: bool = False
    """The counters were corrected (``check(repair=True)`` found mismatches)."""
    warnings: tuple[str, ...] = ()
    """Problems outside the queue, such as an old open transaction holding back vacuum."""

    @property
    def damaged(self) -> bool:
        return bool(self.mismatches) and not self.repaired

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": STATUS_SCHEMA,
            "queue": self.queue,
            "counts": dict(self.counts),
            "mismatches": [
                {"state": m.state, "counted": m.counted, "recounted": m.recounted}
                for m in self.mismatches
            ],
            "repaired": self.repaired,
            "damaged": self.damaged,
            "warnings": list(self.warnings),
        }

    def report_lines(self) -> list[str]:
        """What `fsck` prints: each mismatch, then the outcome."""
        lines = [
            f"{m.state}: the counter says {m.counted}, the items say {m.recounted}"
            for m in self.mismatches
        ]
        if self.repaired:
            lines.append("repaired: the counters now match the items")
        elif not self.mismatches:
            total = sum(self.counts.values())
            lines.append(f"queue {self.queue!r}: {total} item{'' if total == 1 else 's'}; ok")
        return lines

    def advice(self) -> str:
        return "run `statequeue fsck --repair` to correct it"


class QueueCheck(Protocol):
    """What ``fsck`` found, in any store: a ``FsckReport`` for a local journal
    (every record's checksum and sequence, in the files), a ``StoreCheck`` for
    a store that keeps counters (PostgreSQL: the counters against a recount).
    ``to_json`` differs by store; test ``isinstance`` for the details."""

    @property
    def damaged(self) -> bool:
        """Damage was found (and, after a repair, is still there to report)."""

    @property
    def repaired(self) -> bool:
        """A repair was asked for and made."""

    @property
    def warnings(self) -> tuple[str, ...]:
        """Problems outside the queue that harm it (none for a journal)."""

    def to_json(self) -> dict[str, Any]:
        """What `fsck --json` prints."""

    def report_lines(self) -> list[str]:
        """What `fsck` prints, line by line."""

    def advice(self) -> str:
        """What to do about damage found and not repaired."""
