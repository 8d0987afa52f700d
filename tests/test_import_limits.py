"""Issue 21 points 5 and 6: an import's ids, times and counters are checked
against one set of limits (``exported``) before anything is written, on every
store; a journal that already holds an id out of replay's reach is refused as
damage, found by `fsck` and set aside by `fsck --repair`; and a time of 1e20
already stored breaks no view. Real CLI in subprocesses, real PostgreSQL."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from statequeue.api.queue import Queue
from statequeue.api.transfer import import_queue
from statequeue.core import exported, records
from statequeue.core.errors import CorruptJournal, InvalidExport
from statequeue.core.exported import ExportedItem
from statequeue.core.models import ItemState
from statequeue.store.journal.fsck import fsck
from statequeue.store.journal.store import JOURNAL, JournalStore
from statequeue.store.memory import MemoryStore
from tests.conftest import STATEQUEUE
from tests.faults.helpers import build_queue, fingerprint

Env = dict[str, str]
USAGE = 2
DAMAGED = 5
HUGE_ID = 2**40


def sq(env: Env, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [STATEQUEUE, *args], input=stdin, env=env, capture_output=True, timeout=120, check=False
    )


def export_of(*entries: dict[str, object]) -> bytes:
    header = {"statequeue_export": 1, "queue": "src", "items": len(entries)}
    return b"".join(json.dumps(x).encode() + b"\n" for x in (header, *entries))


def pending(item_id: int, item: str, **more: object) -> dict[str, object]:
    return {"id": item_id, "item": item, "state": "pending", **more}


def ended(at: float, dur: float = 0.5) -> dict[str, object]:
    return {
        "t": "end",
        "attempt": 1,
        "state": "failed",
        "ok": False,
        "exit": 1,
        "dur": dur,
        "at": at,
    }


@pytest.fixture(params=["journal", "postgres"])
def store_args(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """CLI arguments that pick the store under test."""
    if request.param == "journal":
        return ()
    return ("--store", request.getfixturevalue("pg_url"))


def _everything(env: Env, args: tuple[str, ...], queue: str) -> bytes:
    """What the queue shows: its items and each one's history, as JSON."""
    listed = sq(env, *args, "list", "-q", queue, "--json")
    assert listed.returncode == 0, listed.stderr
    shown = [sq(env, *args, "show", "-q", queue, str(json.loads(x)["id"]), "--json").stdout
             for x in listed.stdout.splitlines()]  # fmt: skip
    return listed.stdout + b"".join(shown)


BAD_EXPORTS = {
    "id-2^40": (export_of(pending(1, "a"), pending(HUGE_ID, "huge")), f"item id {HUGE_ID}"),
    "id-2^40-alone": (export_of(pending(HUGE_ID, "huge")), f"item id {HUGE_ID}"),
    "id-past-2^53": (export_of(pending(2**53, "huge")), "id must be an integer from 1"),
    "attempt-time-1e20": (
        export_of(pending(2, "late", attempts=1, failures=1, history=[ended(1e20)])),
        "history field 'at' must be seconds",
    ),
    "duration-1e20": (
        export_of(pending(2, "slow", attempts=1, failures=1, history=[ended(1.7e9, 1e20)])),
        "history field 'dur' must be seconds",
    ),
    "retry-at-1e300": (export_of(pending(2, "never", retry_at=1e300)), "retry_at must be seconds"),
    "negative-time": (
        export_of(pending(2, "early", attempts=1, history=[ended(-5.0)])),
        "history field 'at' must be seconds",
    ),
    "attempts-past-int32": (export_of(pending(2, "many", attempts=2**31)), "attempts must be"),
}


@pytest.mark.parametrize("case", list(BAD_EXPORTS))
def test_out_of_limit_import_is_refused_and_changes_nothing(
    case: str, store_args: tuple[str, ...], sq_env: Env
) -> None:
    data, message = BAD_EXPORTS[case]
    first = sq(sq_env, *store_args, "enqueue", "-q", "dst", "kept", "also")
    assert first.returncode == 0, first.stderr
    before = _everything(sq_env, store_args, "dst")
    done = sq(sq_env, *store_args, "import", "-q", "dst", "--merge", stdin=data)
    err = done.stderr.decode()
    assert done.returncode == USAGE, err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err
    assert _everything(sq_env, store_args, "dst") == before
    assert sq(sq_env, *store_args, "fsck", "-q", "dst").returncode == 0


def test_ids_may_leave_gaps_up_to_the_limit(sq_home: Path) -> None:
    """The limit refuses only what replay cannot hold: MAX_ID_GAP unused ids
    pass (the items keep their own ids, and the queue opens again), one more
    is refused (the memory store too)."""
    gap = exported.MAX_ID_GAP
    fits = export_of(pending(1, "a"), pending(gap + 2, "b"))
    with Queue("dst", home=sq_home) as q:
        import_queue(q, fits.splitlines(keepends=True))
        assert [v.item_id for v in q.items()] == [1, gap + 2]
    with Queue("dst", home=sq_home) as q:  # and it opens again (replay)
        assert q.status().counts[ItemState.PENDING] == 2
    beyond = export_of(pending(1, "a"), pending(gap, "b"), pending(gap + 4, "c"))
    memory = Queue("m", store=MemoryStore("m"))
    with pytest.raises(InvalidExport, match=rf"line 4: item id {gap + 4} leaves {gap + 1} ids"):
        import_queue(memory, beyond.splitlines(keepends=True))
    assert list(memory.items()) == []


def test_import_never_writes_an_id_out_of_reach(sq_home: Path) -> None:
    """An export out of id order passes the check (on its sorted ids), but its
    first item's own id would leave more than MAX_ID_GAP ids unused in the
    journal, which replay refuses: it gets the queue's next id instead."""
    gap = exported.MAX_ID_GAP
    data = export_of(pending(gap + 2, "far"), pending(1, "a"))
    with Queue("dst", home=sq_home) as q:
        import_queue(q, data.splitlines(keepends=True))
        ids = {v.item: v.item_id for v in q.items()}
    assert ids == {"far": 1, "a": 2}
    with Queue("dst", home=sq_home) as q:
        assert {v.item: v.item_id for v in q.items()} == ids


def _append_raw(folder: Path, record: dict[str, object]) -> None:
    """Append ``record`` as an older statequeue would have: checksummed, next seq."""
    journal = folder / JOURNAL
    last = json.loads(journal.read_bytes().splitlines()[-1])
    with journal.open("ab") as f:
        f.write(records.encode({"seq": last["seq"] + 1, **record}))


def test_a_stored_id_out_of_reach_is_damage_that_fsck_sets_aside(tmp_path: Path) -> None:
    folder = tmp_path / "q"
    build_queue(folder, items=6, finished=3)
    store = JournalStore(folder, create=False)
    before = fingerprint(store)
    store.close()
    _append_raw(folder, {"t": "item", "id": HUGE_ID, "item": "huge", "state": "pending"})
    lines = (folder / JOURNAL).read_bytes().count(b"\n")
    # Opening refuses it, naming file and line, instead of allocating 9 bytes per id.
    with pytest.raises(CorruptJournal) as refused:
        JournalStore(folder, create=False)
    assert refused.value.line == lines
    assert str(HUGE_ID) in refused.value.reason
    found = fsck(folder, repair=False)
    assert found.damaged and found.journal.bad_lines == [lines]
    repaired = fsck(folder, repair=True)
    assert repaired.repaired and len(repaired.kept) == 1
    assert (folder / repaired.kept[0].rpartition("/")[2]).read_bytes().count(b"\n") == lines
    store = JournalStore(folder, create=False)
    try:
        assert fingerprint(store) == before  # every other item and result is intact
    finally:
        store.close()
    assert not fsck(folder, repair=False).damaged


def test_a_stored_out_of_reach_id_is_refused_by_the_cli(sq_env: Env, sq_home: Path) -> None:
    assert sq(sq_env, "enqueue", "-q", "q", "a", "b").returncode == 0
    _append_raw(sq_home / "q", {"t": "item", "id": HUGE_ID, "item": "huge", "state": "done"})
    for args in (("list",), ("status",), ("fsck",)):
        done = sq(sq_env, *args, "-q", "q")
        assert done.returncode == DAMAGED, done.stderr
        assert b"Traceback" not in done.stderr and b"MemoryError" not in done.stderr
    assert sq(sq_env, "fsck", "-q", "q", "--repair").returncode == 0
    assert sq(sq_env, "list", "-q", "q").stdout.count(b"\n") == 2


def test_a_stored_1e20_time_breaks_no_view(store_args: tuple[str, ...], sq_env: Env) -> None:
    """What an older import let in (a time and a duration of 1e20): show,
    stats and compact still work, on every store."""
    home = Path(sq_env["STATEQUEUE_HOME"])
    store = store_args[1] if store_args else None
    late = ExportedItem(
        item_id=1,
        item="late",
        state=ItemState.DONE,
        attempts=1,
        history=({**ended(1e20, 1e20), "state": "done", "ok": True, "exit": 0},),
    )
    failed = ExportedItem(
        item_id=2,
        item="failed",
        state=ItemState.FAILED,
        attempts=1,
        failures=1,
        history=(ended(1e20),),
    )
    with Queue("q", home=home, store=store) as q:
        q.store.import_items([late, failed])  # below the check, as an older import wrote
        q.enqueue(["fresh"])
    for args in (("show", "1"), ("show", "2"), ("stats",), ("stats", "--json"), ("compact",)):
        done = sq(sq_env, *store_args, *args, "-q", "q")
        assert done.returncode == 0, (args, done.stderr.decode())
        assert b"Traceback" not in done.stderr
    for args in (("show", "1"), ("stats",)):  # after the compaction too
        assert sq(sq_env, *store_args, *args, "-q", "q").returncode == 0
