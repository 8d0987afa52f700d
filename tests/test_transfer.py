"""`statequeue export` / `import`: a queue moves between stores with nothing lost
(issue 12, promise 12). Real PostgreSQL (tests/pg.py), real CLI in subprocesses."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from statequeue.api.queue import Queue
from statequeue.core.exported import ARCHIVED_KEYS
from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, OnInterrupted, Outcome
from statequeue.store.memory import MemoryStore
from tests.conftest import STATEQUEUE

Env = dict[str, str]
NON_UTF8 = b"caf\xe9.pdf".decode("utf-8", "surrogateescape")
FUTURE = 4102444800.0  # 2100-01-01: a retry time that never comes due in a test
USAGE = 2


def sq(env: Env, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [STATEQUEUE, *args], input=stdin, env=env, capture_output=True, timeout=120, check=False
    )


def ok(env: Env, *args: str, stdin: bytes = b"") -> bytes:
    done = sq(env, *args, stdin=stdin)
    assert done.returncode == 0, (args, done.stderr.decode())
    return done.stdout


def finish_one(q: Queue, outcome: Outcome, retry_at: float | None = None) -> int:
    claim = q.claim(new_runner())
    assert claim is not None
    q.finish(claim, outcome, retry_at=retry_at)
    return claim.item_id


def build_source(home: Path) -> None:
    """A local queue with an item in every state a user meets, one archived."""
    with Queue("src", home=home) as q:
        q.enqueue(["archived.txt"])
        finish_one(q, Outcome(ok=True, exit_code=0, duration=0.5, result={"n": 1}))
        q.compact()  # item 1 moves to the archive
        q.enqueue(["done.txt", "failed.txt", "held.txt", "cancelled.txt", "later.txt"])
        q.enqueue([NON_UTF8, "pending.txt"])
        finish_one(q, Outcome(ok=True, exit_code=0, duration=0.25, result=["a", 2]))
        bad = Outcome(
            ok=False, exit_code=3, duration=0.1, reason="exit code 3", stderr_tail="oops\n"
        )
        finish_one(q, bad)
        held = q.claim(new_runner())
        assert held is not None and held.item_id == 4
    # Closing dropped the claim of item 4: its runner is gone. Hold it.
    with Queue("src", home=home) as q:
        q.store.recover(on_interrupted=OnInterrupted.HOLD)
        q.cancel([5])
        retry = Outcome(ok=False, exit_code=1, reason="exit code 1", result={"try": 1})
        assert finish_one(q, retry, retry_at=FUTURE) == 6
        finish_one(q, Outcome(ok=True, exit_code=0, result={"bytes": True}))  # the non-UTF-8 item
        states = {v.item_id: v.state for v in q.items()}
    assert states == {
        1: ItemState.DONE,
        2: ItemState.DONE,
        3: ItemState.FAILED,
        4: ItemState.HELD,
        5: ItemState.CANCELLED,
        6: ItemState.PENDING,
        7: ItemState.DONE,
        8: ItemState.PENDING,
    }


def views(home: Path, queue: str, store: str | None = None) -> dict[str, Any]:
    """What `list --json`, `results --json` and `show --json` print for a queue
    (the same ``to_json`` the CLI prints), made comparable across stores."""
    with Queue(queue, home=home, store=store, create=False) as q:
        listed = [v.to_json() for v in q.items()]
        results = [r.to_json() for r in q.results()]
        shows = {row["id"]: q.history(row["id"]).to_json() for row in listed}
    for r in results:
        del r["archived"]  # where the store keeps it: an import never archives
    results.sort(key=lambda r: r["id"])  # the archive's come first
    for shown in shows.values():
        shown["events"] = _outcomes(shown["events"])
    return {"list": listed, "results": results, "show": shows}


def _outcomes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The outcome events (results, interruptions, user actions), without what
    only means something in the store that wrote them: seq, token and, for
    now, the episode number (the PostgreSQL store does not number episodes
    yet). An archived item's ``arch`` record stands for its last ``end``
    (unless its attempts' summaries list that ``end`` already)."""
    out: list[dict[str, Any]] = []
    for e in events:
        if e["t"] == "arch":
            if out and out[-1]["t"] == "end" and out[-1]["attempt"] == e.get("attempt"):
                continue
            fields = {k: v for k, v in e.items() if k in _RESULT_KEYS}
            e = {"t": "end", "id": e["id"], "state": "done", "ok": True, **fields}
        if e["t"] in ("end", "intr", "set"):
            out.append({k: v for k, v in e.items() if k not in ("seq", "token", "episode")})
    return out


# What an ``arch`` record keeps of its item's last ``end`` (core/exported.py:
# ARCHIVED_KEYS): an export carries its runner and host along.
_RESULT_KEYS = ARCHIVED_KEYS


def test_local_queue_round_trips_through_postgresql(
    pg_url: str, sq_env: Env, sq_home: Path, tmp_path: Path
) -> None:
    build_source(sq_home)
    before = views(sq_home, "src")
    assert any(e["t"] == "intr" for e in before["show"][4]["events"])  # held: its crash
    assert before["show"][3]["stderr_tail"] == "oops\n"
    first, second = tmp_path / "one.ndjson", tmp_path / "two.ndjson"
    ok(sq_env, "export", "-q", "src", "-o", str(first))
    pg = ("--store", pg_url)
    ok(sq_env, *pg, "import", "-q", "moved", str(first))
    assert views(sq_home, "moved", pg_url) == before
    ok(sq_env, *pg, "export", "-q", "moved", "-o", str(second))
    ok(sq_env, "import", "-q", "back", str(second))
    after = views(sq_home, "back")
    assert after == before
    # The item bytes are exact, and the pending retry keeps its time.
    exported = [json.loads(x) for x in second.read_bytes().splitlines()[1:]]
    assert exported[6]["item_b64"] == "Y2Fm6S5wZGY="
    assert exported[5]["retry_at"] == FUTURE
    with Queue("back", home=sq_home) as q:
        assert q.store.next_due() == FUTURE
        assert q.claim(new_runner()).item_id == 8  # type: ignore[union-attr]
    assert sq(sq_env, "fsck", "-q", "back").returncode == 0


def test_imported_queue_keeps_results_through_compaction(sq_env: Env, sq_home: Path) -> None:
    build_source(sq_home)
    export = ok(sq_env, "export", "-q", "src")
    ok(sq_env, "import", "-q", "copy", stdin=export)
    before = views(sq_home, "copy")
    ok(sq_env, "compact", "-q", "copy")  # the imported finished items move to the archive
    assert views(sq_home, "copy") == before
    assert ok(sq_env, "enqueue", "-q", "copy", "done.txt", NON_UTF8) == (
        b"added 0, skipped 2 already queued\n"
    )


def test_running_item_is_exported_as_pending_interrupted(sq_home: Path, sq_env: Env) -> None:
    with Queue("src", home=sq_home) as q:
        q.enqueue(["a", "b"])
        assert q.claim(new_runner()) is not None
        entries = [json.loads(x) for x in ok(sq_env, "export", "-q", "src").splitlines()]
    assert entries[1]["state"] == "pending" and entries[1]["interrupted"] is True
    assert entries[1]["attempts"] == 1 and entries[1]["history"] == []


def test_memory_store_exports_and_imports(sq_home: Path) -> None:
    from statequeue.api.transfer import export_lines, import_queue

    with Queue("src", home=sq_home) as q:
        q.enqueue(["x", "y", NON_UTF8])
        finish_one(q, Outcome(ok=True, result=7))
        q.store.set_paused(True)
        lines = list(export_lines(q))
    memory = Queue(store=MemoryStore("m"))
    result = import_queue(memory, lines)
    assert (result.added, result.skipped, result.paused) == (3, 0, True)
    assert memory.store.is_paused()
    assert [(v.item_id, v.item, v.state) for v in memory.items()] == [
        (1, "x", ItemState.DONE),
        (2, "y", ItemState.PENDING),
        (3, NON_UTF8, ItemState.PENDING),
    ]
    assert [r.result for r in memory.results()] == [7]
    assert list(export_lines(memory))[1:] == lines[1:]


def test_non_empty_target_is_refused_unless_merge(sq_env: Env) -> None:
    ok(sq_env, "enqueue", "-q", "src", "a", "b", "c")
    export = ok(sq_env, "export", "-q", "src")
    ok(sq_env, "enqueue", "-q", "dst", "z", "b")
    refused = sq(sq_env, "import", "-q", "dst", stdin=export)
    assert refused.returncode == USAGE
    assert refused.stderr.decode().startswith("statequeue: queue 'dst' already holds 1 item(s)")
    assert ok(sq_env, "list", "-q", "dst").count(b"\n") == 2  # nothing changed
    merged = json.loads(ok(sq_env, "import", "-q", "dst", "--merge", "--json", stdin=export))
    assert (merged["added"], merged["skipped"]) == (2, 1)
    listed = [json.loads(x) for x in ok(sq_env, "list", "-q", "dst", "--json").splitlines()]
    # Ids 1 and 2 were taken: the new items get the next ones, in export order.
    assert [(r["id"], r["item"]) for r in listed] == [(1, "z"), (2, "b"), (3, "a"), (4, "c")]


GOOD = (
    b'{"statequeue_export": 1, "queue": "q", "items": 1}\n'
    b'{"id": 1, "item": "a", "state": "pending"}\n'
)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"a\nb\n", "line 1: not a statequeue export"),
        (b'{"items": 1}\n', "line 1: not a statequeue export"),
        (GOOD.replace(b'"statequeue_export": 1', b'"statequeue_export": 2'), "version 2"),
        (GOOD[:-1], "cut short"),
        (GOOD.splitlines(keepends=True)[0], "header promises 1 item(s) but 0 follow"),
        (GOOD.replace(b'"pending"', b'"running"'), "line 2: bad item entry"),
        (GOOD.replace(b'"id": 1', b'"id": "1"'), "line 2: bad item entry"),
        (GOOD.replace(b'"a"', b'""'), "line 2: bad item entry"),
        (GOOD + GOOD.splitlines(keepends=True)[1], "item id 1 appears twice"),
        (GOOD + b'{"id": 2, "item": "b", "state": "done"}\n', "promises 1 item(s) but 2"),
        (b"", "empty input"),
    ],
    ids=[
        "not-ndjson",
        "no-header",
        "wrong-version",
        "truncated-line",
        "truncated-file",
        "running",
        "bad-id",
        "empty-item",
        "repeated-id",
        "extra-line",
        "empty",
    ],
)
def test_bad_input_changes_nothing(sq_home: Path, data: bytes, message: str) -> None:
    from statequeue.api.transfer import import_queue
    from statequeue.core.errors import InvalidExport

    with Queue("dst", home=sq_home) as q:
        q.enqueue(["kept"])
        journal = (sq_home / "dst" / "journal.jsonl").read_bytes()
        with pytest.raises(InvalidExport, match=re.escape(message)) as raised:
            import_queue(q, data.splitlines(keepends=True), merge=True)
    assert raised.value.exit_code == USAGE
    assert (sq_home / "dst" / "journal.jsonl").read_bytes() == journal


def test_bad_input_is_one_line_and_exit_2(sq_env: Env, sq_home: Path) -> None:
    ok(sq_env, "enqueue", "-q", "dst", "kept")
    journal = (sq_home / "dst" / "journal.jsonl").read_bytes()
    done = sq(sq_env, "import", "-q", "dst", "--merge", stdin=b"not json\n")
    err = done.stderr.decode()
    assert done.returncode == USAGE, err
    assert err == "statequeue: line 1: not a statequeue export\n"
    assert (sq_home / "dst" / "journal.jsonl").read_bytes() == journal
    fresh = sq(sq_env, "import", "-q", "fresh", stdin=GOOD[:-1])
    assert fresh.returncode == USAGE and not (sq_home / "fresh").exists()


def test_bad_input_into_postgresql_changes_nothing(pg_url: str, sq_env: Env) -> None:
    done = sq(sq_env, "--store", pg_url, "import", "-q", "dst", stdin=GOOD[:-1])
    assert done.returncode == USAGE and done.stderr.count(b"\n") == 1
    listed = sq(sq_env, "--store", pg_url, "list", "-q", "dst")
    assert listed.returncode == 7  # not even the queue was created


def test_import_killed_mid_way_is_completed_by_running_it_again(
    sq_env: Env, sq_home: Path, tmp_path: Path
) -> None:
    """A kill -9 at each write of the import (through the test crash hook):
    the queue opens, fsck accepts it, and the same import run again completes
    it, exactly as an uninterrupted one would have."""
    from statequeue.api.transfer import export_lines, import_queue

    with Queue("src", home=sq_home) as q:
        q.enqueue([f"i{i}" for i in range(2100)])  # three batches of the import
        finish_one(q, Outcome(ok=True, result=1))
        lines = list(export_lines(q))
    export = tmp_path / "e.ndjson"
    export.write_bytes(b"".join(lines))
    with Queue("whole", home=sq_home) as q:
        import_queue(q, lines)
        whole = [v.to_json() for v in q.items()]
    crashed = 0
    for k in range(1, 6):
        name = f"crash{k}"
        env = {**sq_env, "STATEQUEUE_TEST_CRASH": f"write:{k}"}
        killed = sq(env, "import", "-q", name, str(export))
        if killed.returncode == 0:
            break  # past the import's last write
        assert killed.returncode == -9, killed.stderr
        crashed += 1
        if not (sq_home / name / "journal.jsonl").exists():
            continue  # killed while the queue itself was being created
        assert sq(sq_env, "fsck", "-q", name).returncode == 0
        with Queue(name, home=sq_home) as q:
            partial = [v.to_json() for v in q.items()]
            assert whole[: len(partial)] == partial  # a prefix of whole items
            import_queue(q, lines)  # the same import again (no --merge)
            assert [v.to_json() for v in q.items()] == whole
    assert crashed >= 3  # the kills did land inside the import's batches


def test_export_to_a_file_is_whole_or_absent(sq_env: Env, tmp_path: Path) -> None:
    ok(sq_env, "enqueue", "-q", "src", "a")
    (tmp_path / "out").mkdir()
    target = tmp_path / "out" / "e.ndjson"
    target.write_bytes(b"old\n")
    ok(sq_env, "export", "-q", "src", "-o", str(target))
    assert target.read_bytes().startswith(b'{"statequeue_export":1')
    assert os.stat(target).st_mode & 0o777 == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["e.ndjson"]  # no temp file left
    gone = sq(sq_env, "export", "-q", "nope")
    assert gone.returncode == 7 and gone.stderr.count(b"\n") == 1


def _runners(env: Env, *store: str, queue: str) -> tuple[set[str], set[str]]:
    found = json.loads(ok(env, *store, "stats", "-q", queue, "--json"))
    return {g["runner"] for g in found["runners"]}, {g["host"] for g in found["hosts"]}


def test_runner_and_host_of_archived_items_survive_export_and_import(
    sq_env: Env, store_url: str, tmp_path: Path
) -> None:
    """Found by an outside review: `export` of an item done at its first
    attempt and archived by `compact` (one ``arch`` record, no attempt
    summaries) kept only its result, not its runner and host: after `import`,
    `stats` listed its attempts under runner "" and the report as "?". Now
    they come along, into either store."""
    store = ("--store", store_url) if store_url else ()
    ok(sq_env, *store, "enqueue", "-q", "src", stdin=b"a\nb\nc\n")
    ok(sq_env, *store, "run", "-q", "src", "--", "true")
    want = _runners(sq_env, *store, queue="src")
    (runner,) = want[0]
    assert runner and want[1] != {""}
    ok(sq_env, *store, "compact", "-q", "src")
    dump = tmp_path / "src.jsonl"
    ok(sq_env, *store, "export", "-q", "src", "-o", str(dump))
    for target in ((), store):  # into a journal queue, and into the same kind of store
        name = f"dst{len(target)}"
        ok(sq_env, *target, "import", "-q", name, str(dump))
        assert _runners(sq_env, *target, queue=name) == want, (target, name)
        ok(sq_env, *target, "compact", "-q", name)
        assert _runners(sq_env, *target, queue=name) == want, (target, name, "compacted")
        page = ok(sq_env, *target, "report", "-q", name, "-o", "-").decode()
        assert f"{runner} #1" in page and "? #1" not in page
