"""The store interface: one documented contract for every backend.

Nothing above this module may assume files, flock or a single host: the
journal, memory and PostgreSQL stores implement the same ``Store`` methods.
The record-replay logic the journal and memory stores share is in
``record_store``. A feature only some stores have is declared here too, with
a default that says "not here" (None, -1, NotSupported): callers ask the
contract, never the object's type or attributes. Three parts of the contract
are declared beside it, as base classes of ``Store``: leases
(``lease_hooks``), the shared start rate (``rate_hooks``), and the reads of
the queue's history that `stats` folds (``event_reads``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from statequeue.core.errors import ItemNotFound, NotSupported
from statequeue.core.models import (
    Claim,
    EnqueueResult,
    ItemState,
    OnInterrupted,
    Outcome,
    RunnerInfo,
)
from statequeue.store.event_reads import EventReads
from statequeue.store.event_reads import attempts_since as attempts_since  # re-exported
from statequeue.store.event_reads import deferrals_in as deferrals_in  # re-exported
from statequeue.store.lease_hooks import DEFAULT_LEASE as DEFAULT_LEASE  # re-exported
from statequeue.store.lease_hooks import MIN_LEASE as MIN_LEASE  # re-exported
from statequeue.store.lease_hooks import LeaseHooks
from statequeue.store.rate_hooks import RateHooks
from statequeue.store.transitions import (
    RETRYABLE as RETRYABLE,  # re-exported: the contract's default
)

if TYPE_CHECKING:  # views are imported where built: enqueue never needs them
    from statequeue.core.exported import ExportedItem
    from statequeue.core.views import (
        ActiveRunner,
        CompactResult,
        ItemHistory,
        ItemResult,
        ItemView,
        LogsRemoved,
        RecoveryReport,
        Status,
        StoreCheck,
        WorkerView,
    )


class Store(LeaseHooks, RateHooks, EventReads, ABC):
    """A queue's durable state. Every method is atomic with respect to other
    processes using the same queue; none prints or exits."""

    name: str
    url: str | None = None
    """The URL of a store reached by one (PostgreSQL), whose database holds
    the queue; None for a store held in a folder or in memory."""
    has_leases: bool = False
    """Claims are leases that expire unless renewed (PostgreSQL): the run's
    keeper process must be able to fence a frozen runner's children, so
    such a run keeps the shape where that keeper starts every child."""
    chains_claims: bool = False
    """The library's ``work()`` loop claims the next item in the same store
    step as a result (``finish_and_claim``: one commit) on a store where each
    step is a round trip (PostgreSQL). Its price: a program killed between a
    ``done()`` and taking its next item leaves that claim to recovery, which
    counts an interrupted attempt of an item that never ran. A local store
    claims when the loop hands the next item out (no fsync is saved there)."""
    folder: Path | None = None
    """This host's folder for the queue, where it has one: the journal's own
    folder (see ``journal_folder``), or a database store's scratch folder
    (logs of attempts running here, claim locks); None in memory."""

    def journal_folder(self) -> Path | None:
        """The folder that holds the queue's records themselves, for a store
        kept in one (the journal): ``fsck`` checks it record by record, since
        a damaged one cannot be opened, and ``drop`` removes it. None (the
        default) when the records live elsewhere (a database, memory), even
        where the store has a scratch ``folder``."""
        return None

    @property
    def logs_fd(self) -> int:
        """A descriptor of the folder the runner writes attempts' logs in,
        held open by the store (logs are opened relative to it, never through
        a link); -1 (the default) when the store has none."""
        return -1

    @abstractmethod
    def enqueue(self, items: Sequence[str]) -> EnqueueResult:
        """Add the items not already in the queue (same text, in any state, even
        archived), in order. Durable before it returns. An empty sequence adds 0."""

    @abstractmethod
    def claim(
        self,
        runner: RunnerInfo,
        *,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
        among: Collection[int] | None = None,
    ) -> Claim | None:
        """Recover items whose runner died, then atomically claim the lowest-id
        due pending item for ``runner`` (only ids in ``among``, when given) and
        record its start. An item whose earlier attempt still has a live
        process is skipped. Returns None when no item is due (an empty queue
        returns None)."""

    @abstractmethod
    def finish(
        self, claim: Claim, outcome: Outcome, *, retry_at: float | None = None, sync: bool = True
    ) -> ItemState:
        """Record the attempt's outcome, durably (fsync) when ``sync``, before
        returning the item's new state. ``retry_at`` puts a failed item back as
        pending, due at that wall-clock time. Releases the claim."""

    def finish_and_claim(
        self,
        claim: Claim,
        outcome: Outcome,
        *,
        retry_at: float | None = None,
        runner: RunnerInfo,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
        among: Collection[int] | None = None,
    ) -> tuple[ItemState, Claim | None]:
        """``finish`` (durably) then ``claim`` for ``runner``: returns the
        finished item's new state and the next claim (None when none is due,
        or the claim failed: then a plain ``claim`` says why). The result is
        durable before this returns; a store may record both in one atomic
        step with one fsync (the journal store does)."""
        target = self.finish(claim, outcome, retry_at=retry_at)
        taken = self.claim(
            runner, on_interrupted=on_interrupted, max_crashes=max_crashes, among=among
        )
        return target, taken

    def reserve(self, *, among: Collection[int] | None = None) -> bool:
        """Hold, for this store object's next ``claim`` (or ``finish_and_claim``), the
        claim lock of the item it would take (of ``among``, when given), and load
        its text, writing nothing: the item stays pending to every reader, and no
        other process can claim it meanwhile. Then that claim needs no search
        (a runner reserves while its children run, off the path from an exit to
        the next start). A claim that finds the reserved item no longer due and
        pending takes another. At most one is held; ``unreserve`` lets it go, as
        does the process's end (the lock dies with it: nothing to recover).
        True if one is held. Default: False (the store cannot)."""
        return False

    def unreserve(self) -> None:
        """Let the reserved claim lock go, if one is held (``reserve``)."""

    @abstractmethod
    def release(
        self,
        claim: Claim,
        reason: str,
        *,
        uncounted: bool = False,
        to: ItemState = ItemState.PENDING,
    ) -> None:
        """Give a claimed item back as pending without counting a crash (the
        runner was stopped by a signal, or by a full disk: see
        ``space_reserve_freed``). With ``uncounted`` the attempt never
        began (the runner could not start it): it does not count either, and
        its number is given out again. ``to``: FAILED or HELD instead of
        pending, for an item settled without running (``--on-interrupted``
        after ``--verify`` said it was not done). Releases the claim."""

    def check_starts(self, claim: Claim) -> None:
        """The claimed attempt is only a ``--verify`` check until ``check_ends``:
        if its runner dies (or loses its lease) meanwhile, recovery gives the
        item back as pending, counting neither the attempt nor a crash
        (nothing of its command ran), and keeping its mark of an earlier
        interruption, so the next run checks it again. Recorded as a claim's
        start is (not synced: a dead runner does not lose it). ClaimLost /
        StateQueueError for a stale claim. Default: nothing recorded (a death
        during the check then counts as a crash, as during any attempt)."""

    def check_ends(self, claim: Claim) -> None:
        """The check of ``check_starts`` is over and the item's command
        starts: a death of its runner from now on is a crash of the item.
        Default: nothing (see ``check_starts``)."""

    def defer(
        self, claim: Claim, outcome: Outcome, *, delay: float, max_deferrals: int
    ) -> ItemState:
        """The attempt asked to be tried later (exit 75, ``TryLater``): atomically
        count a deferral for the item and put it back as pending, due in
        ``delay`` seconds, without counting a failure, a crash or a retry; or,
        past ``max_deferrals`` deferrals in its episode, record the attempt as
        failed with a reason that says so. Durable before it returns (the
        ``defer`` record names the delay); returns the item's new state.
        Releases the claim. ClaimLost / StateQueueError for a stale claim, as
        ``finish``. Default: NotSupported."""
        raise NotSupported(f"the {type(self).__name__} cannot defer items")

    @abstractmethod
    def interrupt(
        self,
        claim: Claim,
        reason: str,
        *,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
    ) -> ItemState:
        """The process running ``claim`` died mid-attempt while its runner
        lives on (a persistent worker, issue 23): settle the attempt now, as
        crash recovery would (it counts a crash; the policy applies; held as
        poison after ``max_crashes``), recording ``reason``; durable before
        it returns the item's new state. Releases the claim."""

    def keep_space_reserve(self) -> None:
        """Best effort, as a run starts: make sure the queue keeps a little
        disk space in reserve (the journal store: a ``reserve`` file in its
        folder), so that a run stopped by a full disk can still give its
        items back (``space_reserve_freed``). DiskFull when the disk has no
        room for it (the run must not start: it could not give its items
        back); nothing for any other reason it cannot be made. Default:
        nothing (the store keeps no files of its own)."""

    @contextmanager
    def space_reserve_freed(self, failure: BaseException | None = None) -> Iterator[bool]:
        """The run stops on ``failure`` (None: on whatever stopped this store,
        if anything did). If it is this store's DiskFull from a failed write
        that left the records whole (never a failed fsync: after one nothing
        more may be written), free the reserve and yield True: within the
        block the store takes the few records that give the run's items back
        (``release``, fsynced as ever); afterwards it refuses writes again,
        as after any DurabilityError. A later call for the same stop yields
        True again (a library loop gives its items back one call at a time):
        the reserve is freed once, and a write that finds the disk full again
        fails as any write does. Else yield False and change nothing (the
        items are left to recovery). Default: False."""
        yield False

    @abstractmethod
    def sync(self) -> None:
        """Make every record written so far durable (for group commit)."""

    @abstractmethod
    def register_runner(self, runner: RunnerInfo, *, exclusive: bool = False) -> None:
        """Record that ``runner`` is active until ``unregister_runner`` or its death.
        With ``exclusive``, atomically refuse (RunnerActive) if another is alive."""

    @abstractmethod
    def unregister_runner(self, runner_id: str) -> None:
        """Record that the runner stopped cleanly."""

    @abstractmethod
    def active_runners(self) -> list[ActiveRunner]:
        """Runners that are alive now (a dead runner is never listed)."""

    def publish_workers(self, runner_id: str, workers: Sequence[WorkerView]) -> None:
        """Optional: keep ``workers`` (the persistent workers of this process's
        runner ``runner_id``, replacing what it published before) for
        ``active_runners`` and ``status`` to show while the runner lives. Not
        durable and not a record: figures for a person. Default: not kept."""
        return None

    def published_workers(self, runner_id: str) -> tuple[WorkerView, ...]:
        """What ``publish_workers`` keeps for ``runner_id`` now (default: nothing)."""
        return ()

    @abstractmethod
    def status(self) -> Status:
        """Counts per state, live runners, recent failures and held items."""

    def interrupted(self) -> tuple[int, ...]:
        """The items ``status`` lists as interrupted, in id order: recorded as
        running, but their runner is dead (and, where the store can tell, no
        process of theirs holds the claim): the next run recovers them. For
        views that mark such items (`list`, `show`). This default asks
        ``status``; a store overrides it with the part of ``status`` that
        decides it (the one rule, shared)."""
        return self.status().interrupted

    def held_by_dead_runner(self) -> tuple[int, ...]:
        """The items ``status`` lists as held by a dead runner, in id order:
        recorded as running, their runner gone, but a process of their attempt
        still holds the claim (no run takes them until it ends). This default
        asks ``status``."""
        return self.status().held_by_dead_runner

    def runner_hosts(self, runner_ids: Collection[str]) -> dict[str, str]:
        """The host each of ``runner_ids`` registered from, dead runners'
        included while the store keeps their registration (until recovery
        or compaction forgets them); unknown ones are left out. Default: {}."""
        return {}

    @abstractmethod
    def compact(self) -> CompactResult:
        """Rewrite the state as a snapshot, moving finished results to an archive.
        Safe while other processes use the queue."""

    @abstractmethod
    def close(self) -> None:
        """Release every resource; claims still held are left to recovery."""

    @abstractmethod
    def retry(
        self, ids: Sequence[int] | None, *, states: Collection[ItemState] = RETRYABLE
    ) -> list[int]:
        """Put failed or held items back as pending; returns the ids changed.

        ``ids``: ItemNotFound for an unknown id, UsageError for an item in
        another state (pending too, if in ``states``: transitions.retry_allowed);
        then nothing is changed. None: every item in one of ``states`` (failed
        or held) at the moment of the change, chosen and changed atomically, so
        items another process retried meanwhile are not chosen (no error)."""

    @abstractmethod
    def cancel(self, ids: Sequence[int]) -> list[int]:
        """Mark pending, failed or held items cancelled: they never run. Same
        errors as ``retry``; a running item is refused (stop its runner first)."""

    @abstractmethod
    def set_paused(self, paused: bool) -> None:
        """While paused, ``claim`` returns None; runners finish what they hold."""

    @abstractmethod
    def is_paused(self) -> bool:
        """True while the queue is paused (as this process last saw it)."""

    @abstractmethod
    def next_due(self, among: Collection[int] | None = None) -> float | None:
        """The wall-clock time the earliest pending item waiting for a retry
        time comes due; None when none waits. With ``among``, only those ids,
        and a pending one with no retry time counts as due at 0.0."""

    def retry_waiting(self) -> tuple[int, float | None]:
        """How many pending items are not due yet (a retry's backoff, a
        deferral) and when the earliest comes due: ``status``'s ``waiting``
        and ``next_due``, which a store may give without the rest."""
        found = self.status()
        return found.waiting, found.next_due

    @abstractmethod
    def items(self, state: ItemState | None = None) -> Iterator[ItemView]:
        """Every item (or those in ``state``), in id order, archived ones included."""

    @abstractmethod
    def history(self, item_id: int) -> ItemHistory:
        """Every record about one item, its result and stderr tail. ItemNotFound if unknown."""

    @abstractmethod
    def results(self, state: ItemState | None = None) -> Iterator[ItemResult]:
        """The stored result of every finished item (done or failed, or only ``state``),
        archived ones included."""

    def result(self, item_id: int) -> ItemResult | None:
        """The stored result of item ``item_id`` (archived included): what
        ``results`` yields for it. None while it has none (pending, running,
        held, cancelled, or finished without a recorded result); ItemNotFound
        for an id that names no item. Stores answer from an index (a few
        records or rows read, however long the queue); this default reads
        every result."""
        found = self.states([item_id]).get(item_id)
        if found is None:
            raise ItemNotFound(f"no item {item_id} in queue {self.name!r}")
        if found not in (ItemState.DONE, ItemState.FAILED):
            return None
        return next((r for r in self.results(found) if r.item_id == item_id), None)

    def results_of(self, ids: Collection[int]) -> dict[int, ItemResult]:
        """The stored result of each of ``ids`` that has one now (what
        ``result`` gives for it); ids with none, or naming no item, are left
        out. For a few items of a big queue (a resumable call, a small
        ``map``): stores read them from their index, an item at a time, and
        pass over every result only when the ids are a good share of the
        queue. This default passes over every result."""
        wanted = set(ids)
        if not wanted:
            return {}
        return {r.item_id: r for r in self.results() if r.item_id in wanted}

    @abstractmethod
    def notices(self) -> list[str]:
        """Messages for the user gathered since the last call (torn tails repaired)."""

    def check(self, *, repair: bool = False) -> StoreCheck:
        """Recount the items per state from the stored rows and compare with the
        counters ``status`` reads, in one consistent snapshot; with ``repair``,
        correct the counters (concurrent writers stay correct). Reports what
        outside the queue harms it (an old open transaction). Raises
        NotSupported for a store without counters: a journal is checked on its
        ``journal_folder`` (``statequeue.store.opening.fsck_folder``), since a
        damaged one cannot be opened; ``Queue.fsck`` chooses for an open store."""
        raise NotSupported(f"the {type(self).__name__} is checked on its folder, not by check()")

    stores_logs: bool = False
    """True when the store keeps finished attempts' output itself (``save_log``);
    otherwise the runner's log files in the queue folder are the logs."""

    def save_log(self, claim: Claim, data: bytes) -> bool:
        """Store the output of ``claim``'s attempt (already capped by --log-limit),
        if ``claim`` still holds its item (its token is current): a stale runner
        stores nothing. Returns True when stored. Called just before ``finish``;
        made durable by it (the log goes with its attempt's result). The default
        stores nothing: the log file stays where the runner wrote it."""
        return False

    def remove_finished_logs(self, keep: float) -> LogsRemoved:
        """Remove the logs of finished items (those in a state that ``compact``
        archives, whether it has archived them yet or not) last written more
        than ``keep`` seconds ago (``compact --keep-logs``), durably; what was
        removed. Needs no space: ``compact`` calls it before it writes, so
        that on a full disk it frees what the archive needs. The default
        removes nothing (a store that keeps no log files of its own)."""
        from statequeue.core.views import LogsRemoved  # lazy: views, see the imports

        return LogsRemoved()

    def read_log(self, item_id: int, attempt: int, offset: int = 0) -> bytes | None:
        """The output attempt ``attempt`` of item ``item_id`` logged, from byte
        ``offset`` on; None when it logged nothing (or the store keeps no logs)."""
        return None

    def live_texts(self, ids: Collection[int]) -> dict[int, str]:
        """The text of each of ``ids`` that names an item not done (pending,
        running, failed, held); other ids are left out. For naming the few
        items a view shows (`status`: the running ones). This default reads
        every item."""
        wanted = set(ids)
        if not wanted:
            return {}
        return {
            v.item_id: v.item
            for v in self.items()
            if v.item_id in wanted and v.state is not ItemState.DONE
        }

    def find_ids(self, texts: Collection[str]) -> dict[str, int]:
        """The id of each of ``texts`` that names an item (exact text; archived
        items included); texts that name none are left out. This default reads
        every item."""
        wanted = set(texts)
        return {v.item: v.item_id for v in self.items() if v.item in wanted}

    def states(self, ids: Collection[int]) -> dict[int, ItemState]:
        """The current state of each of ``ids`` that names an item (done for
        archived ones). This default reads every item."""
        wanted = set(ids)
        return {v.item_id: v.state for v in self.items() if v.item_id in wanted}

    @abstractmethod
    def export_items(self) -> Iterator[ExportedItem]:
        """Every item in id order, archived ones included, with its state,
        counters and outcome history, as of one moment (a running item is
        given as pending, interrupted). An empty queue yields nothing."""

    @abstractmethod
    def import_items(self, entries: Sequence[ExportedItem]) -> EnqueueResult:
        """Add each entry whose item (exact bytes) is not in the queue yet, in
        order, with its state, counters and history. An entry keeps its id
        when that id is above every id in the queue (so all of them, into an
        empty queue), else takes the next one. Durable before it returns;
        atomic per item and done in batches: a crash leaves a prefix of the
        entries imported, each whole, and running the import again (the items
        present are skipped) completes it."""

    def wake_fd(self) -> int | None:
        """A file descriptor that becomes readable when another process may
        have given this queue work (enqueue, retry, resume, import): a
        ``run --follow`` runner waits on it beside its poll. None when the
        store has none (the default): followers poll."""
        return None

    def drain_wake(self) -> bool:
        """Consume what made ``wake_fd`` readable. False when that fd is dead:
        the caller stops watching it, and a later ``wake_fd`` may give another."""
        return False

    @abstractmethod
    def recover(
        self,
        *,
        on_interrupted: OnInterrupted = OnInterrupted.RETRY,
        max_crashes: int = 3,
        only: Collection[int] | None = None,
    ) -> RecoveryReport:
        """Apply the policy to items whose runner (and its children) are gone,
        atomically per item; returns what was done. ``claim`` does this too.
        ``only``: these items alone (a user's cancel or retry of them)."""

    def liveness_fds(self, runner_id: str) -> tuple[int, ...]:
        """The fds by which this process holds ``runner_id``'s liveness lock,
        for the run's keeper to hold too, until every process the runner
        left is gone (run/guard.py). Default: none (no such lock)."""
        return ()

    def leftover_note(self, runner_id: str) -> tuple[int, str] | None:
        """Where the keeper of runner ``runner_id`` notes the processes it
        waits for after the run, holding their items' claims
        (core/leftover_note.py): a folder's fd, held by the store, and a name
        in it. Default: None (the store reads no such note)."""
        return None

    def held_by_leftovers(self, among: Collection[int] | None = None) -> dict[int, tuple[int, ...]]:
        """The pending items (of ``among``, if given) that a process left by
        an earlier attempt keeps from being claimed (its keeper holds the
        claim until it ends: promise 4), each with the live pids its keeper
        noted. A hint for a person, read without the queue lock. Default: {}
        (the store cannot tell)."""
        return {}

    @abstractmethod
    def commands(self) -> list[list[str]]:
        """Command templates of earlier runs, oldest first (consecutive repeats merged)."""
