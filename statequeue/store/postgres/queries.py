"""What the PostgreSQL store reads back: status, listings, results, history, events.

Each function reads one queue through an open connection; none writes,
except ``status``, which first folds the count deltas into the counters.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from statequeue.core import process_state
from statequeue.core.errors import ItemNotFound
from statequeue.core.identity import boot_id, host_name
from statequeue.core.models import ItemState
from statequeue.core.recent_rate import FIRST_BATCH, recent_rate
from statequeue.core.records import item_fields
from statequeue.core.views import (
    STARTS_WINDOW,
    ActiveRunner,
    Failure,
    ItemHistory,
    ItemResult,
    ItemView,
    Starts,
    Status,
    WorkerView,
    starts_of,
)
from statequeue.store.postgres import sql
from statequeue.store.postgres.connection import Connection
from statequeue.store.transitions import last_line

PAGE = 5_000
RECENT_FAILURES = 5
RATE_WINDOW = 60.0


def text_of(item: bytes) -> str:
    """An item's bytes as the str the code holds (surrogateescape for non-UTF-8)."""
    return os.fsdecode(bytes(item))  # bytea may arrive as memoryview


def roll_up_counts(conn: Connection, queue: str) -> None:
    with conn.transaction():
        conn.execute(sql.ROLL_UP_COUNTS, {"q": queue})


def counts(conn: Connection, queue: str) -> dict[str, int]:
    found = {s.value: 0 for s in ItemState}
    for state, n in conn.execute(sql.COUNTS, {"q": queue}):
        found[str(state)] = int(n)
    return found


def pid_gone(pid: int) -> bool:
    """Whether no process has ``pid`` (on this host), or only a zombie: a
    process that has ended, not yet reaped by its parent (a runner killed
    -9 whose parent is busy), has closed its fds and runs nothing."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return process_state.state(pid) == b"Z"  # no /proc: b"", the kill above decides


def active_runners(conn: Connection, queue: str) -> list[ActiveRunner]:
    """The runners alive. A runner's heartbeat lease outlives it (killed -9,
    it keeps its row until the lease ends); on its own host and boot, a gone
    pid tells at once that it is dead, as recovery there knows (reaping.py)."""
    alive: list[ActiveRunner] = []
    here = (host_name(), boot_id())
    for row in conn.execute(sql.ACTIVE_RUNNERS, {"q": queue}).fetchall():
        pid, since, boot = int(row[1]), float(row[3]), row[9]
        stopped = False
        if boot and (str(row[2]), str(boot)) == here:
            if pid_gone(pid):
                continue
            stopped = process_state.stopped_since(pid, since)
        alive.append(_runner_view(row, stopped=stopped))
    if not here[1]:
        return alive
    # This host's runners whose lease lapsed while their process was stopped
    # (SIGSTOP, ctrl-Z): alive, and runners again once continued. One whose
    # lease ended between the two statements is in both: listed once.
    listed = {r.runner_id for r in alive}
    key = {"q": queue, "host": here[0], "boot": here[1]}
    for row in conn.execute(sql.LAPSED_HERE, key).fetchall():
        if str(row[0]) not in listed and process_state.stopped_since(int(row[1]), float(row[3])):
            alive.append(_runner_view(row, stopped=True))
    return alive


def _runner_view(row: tuple[Any, ...], *, stopped: bool) -> ActiveRunner:
    """A row of ``sql.ACTIVE_RUNNERS`` or ``sql.LAPSED_HERE`` as a view."""
    rid, pid, host, since, running, heard, ends, lease, workers, _ = row
    return ActiveRunner(
        runner_id=str(rid),
        pid=int(pid),
        host=str(host),
        started_at=float(since),
        running=tuple(running),
        heard_ago=None if heard is None else float(heard),
        lease_ends_at=None if ends is None else float(ends),
        lease=None if lease is None else float(lease),
        workers=_workers(workers),
        stopped=stopped,
    )


def _workers(rows: Any) -> tuple[WorkerView, ...]:
    """The ``workers`` a runner published (``writes.publish_workers``); () if none or unreadable."""
    try:
        return tuple(WorkerView(*row) for row in rows or ())
    except TypeError:  # not as written: nothing shown
        return ()


HeldHere = Callable[[int, str], bool]
"""Whether a process on this host holds the claim lock of (token, runner)."""


def _not_held(token: int, runner_id: str) -> bool:
    return False


def runner_gone(
    conn: Connection, queue: str, held: HeldHere
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The running items whose runner is gone, as recovery finds them: their
    lease ended, or their runner ran on this host and boot and its pid is
    gone (whether or not a later run marked it stopped). In two, as recovery
    treats them (reaping.py): those it takes (interrupted: the next run
    recovers them), and those whose claim lock on this host a process of
    the attempt still holds (``held``: no run takes them until it ends)."""
    found = {
        int(i): (int(t or 0), str(r or ""))
        for i, t, r in conn.execute(sql.INTERRUPTED, {"q": queue}).fetchall()
    }
    boot = boot_id()
    if boot:
        gone: dict[int, bool] = {}
        key = {"q": queue, "host": host_name(), "boot": boot}
        for i, t, pid, r in conn.execute(sql.SAME_HOST, key).fetchall():
            if int(pid) not in gone:
                gone[int(pid)] = pid_gone(int(pid))
            if gone[int(pid)]:
                found.setdefault(int(i), (int(t or 0), str(r or "")))
    still = {i for i, (token, runner) in found.items() if held(token, runner)}
    return tuple(sorted(found.keys() - still)), tuple(sorted(still))


def runner_hosts(conn: Connection, queue: str, runner_ids: Collection[str]) -> dict[str, str]:
    """The host of each of ``runner_ids`` registered on ``queue`` (``Store.runner_hosts``)."""
    rows = conn.execute(
        "SELECT runner_id, host FROM statequeue.runners"
        " WHERE queue = %s AND runner_id = ANY(%s::text[])",
        (queue, sorted(runner_ids)),
    ).fetchall()
    return {str(r): str(h) for r, h in rows if h}


def status(conn: Connection, queue: str, paused: bool, held_here: HeldHere | None = None) -> Status:
    """``held_here``: see ``runner_gone`` (None: no lock file looked at, as
    `queues` lists every queue)."""
    roll_up_counts(conn, queue)
    q = {"q": queue}
    failed = conn.execute(
        "SELECT l.id, i.item, l.attempts, l.reason, l.last_err FROM statequeue.live l"
        " JOIN statequeue.items i ON i.queue = l.queue AND i.id = l.id"
        " WHERE l.queue = %(q)s AND l.state = 'failed' ORDER BY l.changed_at DESC, l.id DESC"
        " LIMIT %(n)s",
        {**q, "n": RECENT_FAILURES},
    ).fetchall()
    held = conn.execute(
        "SELECT id FROM statequeue.live WHERE queue = %(q)s AND state = 'held' ORDER BY id", q
    ).fetchall()
    runners = active_runners(conn, queue)
    interrupted, still_held = runner_gone(conn, queue, held_here or _not_held)
    marked = conn.execute(
        "SELECT id FROM statequeue.live WHERE queue = %(q)s AND state = 'pending'"
        " AND interrupted ORDER BY id",
        q,
    ).fetchall()
    waiting, next_due = retry_waiting(conn, queue, time.time())
    return Status(
        queue=queue,
        counts=counts(conn, queue),
        runners=tuple(runners),
        recent_failures=tuple(
            Failure(int(i), text_of(b), int(a), str(r), last_line(str(e)))
            for i, b, a, r, e in failed
        ),
        held=tuple(int(r[0]) for r in held),
        interrupted=interrupted,
        interrupted_pending=tuple(int(r[0]) for r in marked),
        paused=paused,
        rate=_rate(conn, queue),
        starts=_starts(conn, queue),
        held_by_dead_runner=still_held,
        waiting=waiting,
        next_due=next_due,
    )


def retry_waiting(conn: Connection, queue: str, now: float) -> tuple[int, float | None]:
    """How many pending items are not due at ``now`` (a retry's backoff, a
    deferral) and when the earliest comes due (``status``): a range of the
    index ``live_retry_at`` (schema version 15)."""
    row = conn.execute(
        "SELECT count(*), min(retry_at) FROM statequeue.live WHERE queue = %(q)s"
        " AND state = 'pending' AND retry_at IS NOT NULL AND retry_at > %(now)s",
        {"q": queue, "now": now},
    ).fetchone()
    if row is None or not row[0]:
        return 0, None
    return int(row[0]), float(row[1])


def _rate(conn: Connection, queue: str) -> float | None:
    return finish_rate(conn, queue, time.time())


def finish_rate(conn: Connection, queue: str, now: float) -> float | None:
    """Items finished per second over the last ``RATE_WINDOW`` seconds, since
    the work they count began (``core.recent_rate``): the earliest start
    (``at - duration``) of the attempts finished in the window, not the first
    finish. None for no finish in the window."""
    since = now - RATE_WINDOW
    row = conn.execute(
        "SELECT count(*), min(at - coalesce(duration, 0)) FROM statequeue.results"
        " WHERE queue = %(q)s AND at >= %(since)s",
        {"q": queue, "since": since},
    ).fetchone()
    if row is None or int(row[0]) < 1:
        return None
    return recent_rate(int(row[0]), max(float(row[1]), since), now, RATE_WINDOW)


# The starts among the queue's latest events: the index on (queue, xid),
# read backwards, a bounded look however long the queue's history. Not by
# seq: no index has it since version 7 (lean_writes.py), and `ORDER BY seq`
# read and sorted every event of the queue, each `status` (0.36 s at 600,000
# events). The newest transactions' events are the newest events but for
# the order among those that ran at once, which a count over a minute does
# not see.
_STARTS = f"""
WITH s AS (
    SELECT at FROM (
        SELECT body->>'t' AS t, (body->>'at')::float8 AS at FROM statequeue.events
        WHERE queue = %(q)s ORDER BY xid DESC LIMIT %(look)s
    ) e WHERE t = 'start' AND at >= %(since)s
)
SELECT count(*), min(at), max(at),
    count(*) FILTER (WHERE at <= (SELECT min(at) FROM s) + {FIRST_BATCH!r}) FROM s
"""
_STARTS_LOOK = 4_000  # about the 2,000 starts the journal store keeps (a start, an end each)


def _starts(conn: Connection, queue: str) -> Starts | None:
    """The starts of the last minute, every runner's (``Status.starts``)."""
    now = time.time()
    row = conn.execute(
        _STARTS, {"q": queue, "look": _STARTS_LOOK, "since": now - STARTS_WINDOW}
    ).fetchone()
    if row is None or row[1] is None:
        return None
    return starts_of(int(row[0]), float(row[1]), float(row[2]), now, int(row[3]))


def items(conn: Connection, queue: str, state: ItemState | None) -> Iterator[ItemView]:
    after = 0
    while True:
        rows = conn.execute(
            sql.ITEMS_PAGE,
            {"q": queue, "after": after, "state": state.value if state else None, "limit": PAGE},
        ).fetchall()
        for item_id, item, current, attempts, reason in rows:
            yield ItemView(
                int(item_id), text_of(item), ItemState(current), int(attempts), str(reason)
            )
        if len(rows) < PAGE:
            return
        after = int(rows[-1][0])


def results(conn: Connection, queue: str, state: ItemState | None) -> Iterator[ItemResult]:
    row = conn.execute("SELECT next_id FROM statequeue.queues WHERE name = %s", (queue,)).fetchone()
    end = int(row[0]) if row else 1
    for after in range(0, end, PAGE):
        rows = conn.execute(
            sql.RESULTS_PAGE, {"q": queue, "after": after, "upto": after + PAGE}
        ).fetchall()
        for item_id, item, st, attempt, code, dur, reason, result, current, archived in rows:
            if current != st or current not in ("done", "failed"):
                continue  # retried since, or running again: not a finished item now
            if state is not None and current != state.value:
                continue
            yield ItemResult(
                int(item_id),
                text_of(item),
                ItemState(current),
                int(attempt),
                code,
                dur,
                str(reason),
                result,
                archived=bool(archived),
            )


def result(conn: Connection, queue: str, item_id: int) -> ItemResult | None:
    """Item ``item_id``'s stored result, as ``results`` yields it; None if it
    has none now; ItemNotFound if no item has that id. One statement, index probes."""
    row = conn.execute(sql.ONE_RESULT, {"q": queue, "id": item_id}).fetchone()
    if row is None:
        raise ItemNotFound(f"no item {item_id} in queue {queue!r}")
    return _result_row(item_id, row)


def results_of(conn: Connection, queue: str, ids: Collection[int]) -> dict[int, ItemResult]:
    """``result`` of each of ``ids`` that has one now (the others left out):
    a statement per page of ids, index probes for each, however big the queue."""
    found: dict[int, ItemResult] = {}
    wanted = sorted(i for i in set(ids) if 0 < i < 1 << 63)  # past a bigint: no item has it
    for start in range(0, len(wanted), PAGE):
        rows = conn.execute(sql.SOME_RESULTS, {"q": queue, "ids": wanted[start : start + PAGE]})
        for item_id, *row in rows:
            r = _result_row(int(item_id), row)
            if r is not None:
                found[r.item_id] = r
    return found


def _result_row(item_id: int, row: Sequence[Any]) -> ItemResult | None:
    """The ItemResult of a row of ONE_RESULT (SOME_RESULTS without its id);
    None when the item has no result now."""
    item, current, st, attempt, code, dur, reason, found, archived = row
    if st is None or current != st or current not in ("done", "failed"):
        return None  # none, or retried since (running again): as ``results`` skips it
    return ItemResult(
        item_id,
        text_of(item),
        ItemState(current),
        int(attempt),
        code,
        dur,
        str(reason),
        found,
        archived=bool(archived),
    )


def find_ids(conn: Connection, queue: str, texts: Collection[str]) -> dict[str, int]:
    """The id of each of ``texts`` that names an item (exact bytes)."""
    found: dict[str, int] = {}
    wanted = list(dict.fromkeys(texts))
    for start in range(0, len(wanted), PAGE):
        chunk = {os.fsencode(t): t for t in wanted[start : start + PAGE]}
        keys = [hashlib.sha256(b).digest() for b in chunk]
        for item, item_id in conn.execute(sql.FIND_IDS, {"q": queue, "keys": keys}):
            text = chunk.get(bytes(item))
            if text is not None:
                found[text] = int(item_id)
    return found


def states(conn: Connection, queue: str, ids: Collection[int]) -> dict[int, ItemState]:
    """The current state of each of ``ids`` that names an item."""
    found: dict[int, ItemState] = {}
    wanted = sorted(i for i in set(ids) if 0 < i < 1 << 63)  # past a bigint: no item has it
    for start in range(0, len(wanted), PAGE):
        rows = conn.execute(sql.STATES, {"q": queue, "ids": wanted[start : start + PAGE]})
        found.update((int(i), ItemState(s)) for i, s in rows)
    return found


def live_texts(conn: Connection, queue: str, ids: list[int]) -> dict[int, str]:
    """The text of each of ``ids`` that is in the hot table (not done)."""
    rows = conn.execute(
        "SELECT l.id, i.item FROM statequeue.live l"
        " JOIN statequeue.items i ON i.queue = l.queue AND i.id = l.id"
        " WHERE l.queue = %(q)s AND l.id = ANY(%(ids)s)",
        {"q": queue, "ids": ids},
    )
    return {int(i): text_of(item) for i, item in rows}


def history(conn: Connection, queue: str, item_id: int) -> ItemHistory | None:
    row = conn.execute(
        "SELECT i.item, coalesce(l.state, i.state) FROM statequeue.items i"
        " LEFT JOIN statequeue.live l ON l.queue = i.queue AND l.id = i.id"
        " WHERE i.queue = %(q)s AND i.id = %(id)s",
        {"q": queue, "id": item_id},
    ).fetchone()
    if row is None:
        return None
    text = text_of(row[0])
    # Enqueue events are written one per batch: the item's own is rebuilt
    # here, with the batch's seq and time.
    key = {"q": queue, "id": item_id}
    enq: dict[str, Any] = {"t": "enq", "id": item_id, **item_fields(text)}
    batch = conn.execute(sql.ENQUEUE_BATCH, key).fetchone()
    if batch is not None:
        enq["seq"] = batch[0]
        if "at" in batch[1]:
            enq["at"] = batch[1]["at"]
    events: list[dict[str, Any]] = [enq]
    for seq, body in conn.execute(sql.ITEM_EVENTS, key):  # archived ones included
        events.append({**body, "seq": seq})
    last = conn.execute(sql.LAST_RESULT, key).fetchone()
    return ItemHistory(
        item_id=item_id,
        item=text,
        state=ItemState(row[1]),
        events=tuple(events),
        result=last[0] if last else None,
        stderr_tail=str(last[1]) if last else "",
    )
