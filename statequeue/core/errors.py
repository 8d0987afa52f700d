"""Exceptions. One root; each subclass's docstring is its default message."""

from __future__ import annotations

import errno
import os
import signal

from statequeue.core.exitcodes import ExitCode

# What to raise or free when a command is short of fds, processes or memory
# (`ulimit -n` is no help when a fork failed for want of processes).
SHORTAGE_REMEDIES = {
    errno.EMFILE: "raise the open-file limit, e.g. `ulimit -n`",
    errno.ENFILE: "the system's open-file table is full: close files elsewhere",
    errno.EAGAIN: "raise the process limit, e.g. `ulimit -u`",
    errno.ENOMEM: "free some memory",
}


class StateQueueError(Exception):
    """statequeue failed."""

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str | None = None) -> None:
        doc = (type(self).__doc__ or "").strip()
        super().__init__(message or doc)

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class UsageError(StateQueueError):
    """invalid usage."""

    exit_code = ExitCode.USAGE


class InvalidQueueName(UsageError):
    """invalid queue name."""


class InvalidItem(UsageError):
    """invalid item."""

    index: int | None = None
    """Where the item is in the input (0-based), when a batch was checked."""


class ItemTooLarge(InvalidItem):
    """item is larger than the size limit."""


class InvalidResult(UsageError):
    """the result or reason cannot be stored as JSON."""


class QueueClosed(UsageError):
    """the queue is closed."""


class QueueForked(UsageError):
    """this Queue was opened in another process (before a fork); open a new Queue in this one."""


class InvalidDuration(UsageError):
    """invalid duration."""


class CommandNotFound(UsageError):
    """the command to run was not found; nothing was claimed."""


class CommandCannotStart(UsageError):
    """the command cannot start (a persistent worker); stopped, its item back to pending."""


class VerifyBroken(UsageError):
    """the --verify check cannot run; stopped without running anything more."""


class NotFound(StateQueueError):
    """not found."""

    exit_code = ExitCode.NOT_FOUND


class QueueNotFound(NotFound):
    """no such queue."""


class ItemNotFound(NotFound):
    """no such item."""


class DamagedState(StateQueueError):
    """the queue's files are damaged; run `statequeue fsck`."""

    exit_code = ExitCode.DAMAGED


class CorruptJournal(DamagedState):
    """the journal is corrupt."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        super().__init__(
            f"{path}: line {line}: {reason}; refusing to open "
            "(run `statequeue fsck --repair` to salvage the valid records)"
        )


class DurabilityError(StateQueueError):
    """a write or fsync failed; stopped without acknowledging (the queue stays recoverable)."""

    exit_code = ExitCode.IO_ERROR
    appendable = False
    """True only when a write failed (never an fsync) and the file was cut
    back to its last good record: nothing written before is in doubt, so a
    record may follow once space is freed (a run gives its items back so, on
    a full disk). After a failed fsync nothing more may be written (DESIGN.md)."""


class DiskFull(DurabilityError):
    """a write failed: the disk is full; stopped without acknowledging."""

    path = ""
    """The file whose write failed, where known (the CLI's hint looks beside it)."""


class ShortOfResources(DurabilityError):
    """a write failed for want of fds or memory; stopped without acknowledging."""

    exit_code = ExitCode.RESOURCES


class RunnerActive(UsageError):
    """another runner is active on this queue (`run --single`; `drop`)."""

    exit_code = ExitCode.RUNNER_ACTIVE


class LockTimeout(StateQueueError):
    """the queue is locked by another process."""

    exit_code = ExitCode.LOCKED


class UnsafeFolder(StateQueueError):
    """a folder is not safe: another user owns it, group or others can write it, or it is a link."""

    exit_code = ExitCode.UNSAFE_FOLDER


class FolderAtFileName(UnsafeFolder):
    """a folder stands where statequeue keeps a file of the queue (remove it).

    Refused as a FIFO there is (exit 9); ``queues`` lists its queue as damaged
    and ``drop`` removes it, as for a queue broken in other ways."""


class NoAccess(UsageError):
    """cannot access a file of the queue."""

    why = "Permission denied"
    """The system's reason (``strerror``): a read-only mount says so."""


class ItemNotSettled(UsageError):
    """the previous work item was neither marked done nor failed."""


class KeeperLost(StateQueueError):
    """the run's keeper process ended unexpectedly; stopped (unfinished items run again)."""


class ResourcesExhausted(StateQueueError):
    """the runner ran out of a system resource (open files, processes or memory)."""

    exit_code = ExitCode.RESOURCES


class WorkerBroken(StateQueueError):
    """the persistent worker exited before replying to its first request, twice in a row."""

    exit_code = ExitCode.WORKER_BROKEN


class InvalidStoreUrl(UsageError):
    """invalid store URL (expected postgresql://... or a libpq conninfo)."""


class StoreUnreachable(StateQueueError):
    """cannot reach the PostgreSQL store."""

    exit_code = ExitCode.STORE_UNREACHABLE


class UnsafeSchema(StateQueueError):
    """the PostgreSQL statequeue schema, or something in it, is another role's, or has a trigger."""

    exit_code = ExitCode.UNSAFE_FOLDER


class StoreDenied(StateQueueError):
    """the PostgreSQL store denied an action: this role lacks a privilege it needs."""

    exit_code = ExitCode.STORE_UNREACHABLE


class StoreFailed(StateQueueError):
    """the PostgreSQL store failed a statement unexpectedly (what the server said follows).

    The store's problem, not an item's: exit 11, never 1 (failed or held items)."""

    exit_code = ExitCode.STORE_UNREACHABLE


class SchemaTooNew(StateQueueError):
    """the database's statequeue schema is newer than this statequeue; upgrade statequeue."""

    exit_code = ExitCode.SCHEMA_TOO_NEW


class ClaimLost(StateQueueError):
    """the claim is no longer held (its fencing token is stale); nothing was recorded."""


class InvalidExport(UsageError):
    """not a statequeue export (or a damaged one); nothing was imported."""


class ImportRefused(UsageError):
    """the target queue holds items the export does not; use --merge to add to it."""


class NotSupported(UsageError):
    """this store does not support that operation yet."""


class MapFailed(StateQueueError):
    """some items of the map failed."""

    def __init__(
        self,
        failures: list[tuple[str, str]],
        results: list[object],
        message: str | None = None,
        *,
        errors: dict[str, BaseException] | None = None,
    ) -> None:
        self.failures = failures
        """Every item that failed, with its last reason, in input order."""
        self.errors = errors or {}
        """The exception object of each failed item whose last attempt raised
        in this process (not one that failed in an earlier run or elsewhere);
        the first is also ``__cause__``."""
        self.results = results
        """The results in input order; None where the item failed."""
        first = f"; first: {failures[0][1]}" if failures else ""
        super().__init__(message or f"{len(failures)} of {len(results)} items failed{first}")


class PoolBroken(StateQueueError):
    """a worker process of the map died (no item's fault); stopped, its item given back."""

    def __init__(
        self,
        message: str | None = None,
        *,
        worker: int | None = None,
        worker_exit: int | None = None,
        ended_by_pool: bool = False,
    ) -> None:
        super().__init__(message)
        self.worker = worker
        """The pid of the worker that ran the item, if it had started it."""
        self.worker_exit = worker_exit
        """How that worker ended (-signal, or its exit code); None if unknown."""
        self.ended_by_pool = ended_by_pool
        """Whether the pool killed that worker, once another one had died (it
        outlived the grace after SIGTERM)."""

    @property
    def crashed(self) -> bool:
        """Whether the item's own worker died on its own while running it (not
        terminated by the pool, as the others are once one dies): the item's
        attempt is then an interrupted one, a crash."""
        if self.ended_by_pool:
            return False
        return self.worker_exit is not None and self.worker_exit != -signal.SIGTERM

    def how(self) -> str:
        """How the worker ended, in words: "was killed by signal 9"."""
        code = self.worker_exit
        if code is None:
            return "died"
        return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


class UnknownState(UsageError):
    """unknown item state."""


class TryLater(StateQueueError):
    """the item asks to be tried later."""

    def __init__(self, seconds: float | None = None, message: str | None = None) -> None:
        super().__init__(message)
        self.seconds = seconds
        """Seconds to wait before the item runs again; None: an adaptive backoff."""


def shortage_remedy(exc: OSError) -> str | None:
    """What to do when ``exc`` says the process (or the machine) is short of
    fds, processes or memory; None for any other error. EAGAIN counts (a fork
    short of processes) unless it is a write that would block: a non-blocking
    stdout that is full says EAGAIN too, and carries ``characters_written``."""
    remedy = SHORTAGE_REMEDIES.get(exc.errno or 0)
    if remedy is not None and exc.errno == errno.EAGAIN and isinstance(exc, BlockingIOError):
        try:
            exc.characters_written  # noqa: B018  (set only by a buffered write)
        except AttributeError:
            return remedy
        return None
    return remedy


def os_error_text(exc: OSError) -> str:
    """``PATH: reason`` for an OSError, or the reason alone when it names no
    file (an fd number, as an fstat's error carries, names none)."""
    reason = exc.strerror or str(exc)
    name = exc.filename
    if isinstance(name, str | bytes) and name:
        return f"{os.fsdecode(name)}: {reason}"
    return reason
