"""`statequeue import` into PostgreSQL killed with SIGKILL mid-import (issue 12,
promise 12): what committed is whole and consistent (each item with its
results, history and counts, or not at all), and running the same import
again completes it, ending equal to the export (real server, tests/pg.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from statequeue.api.queue import Queue
from tests.conftest import STATEQUEUE
from tests.pg import sql as _sql

pytest.importorskip("psycopg")
from statequeue.store.postgres.transfer import IMPORT_BATCH  # after the skip: needs psycopg

ITEMS = 40 * IMPORT_BATCH  # long enough to be caught mid-way
DEADLINE = 60.0


def _export(path: Path) -> list[dict[str, Any]]:
    """A synthetic export: every third item done with one result, the rest pending."""
    entries = []
    for i in range(1, ITEMS + 1):
        entry: dict[str, Any] = {"id": i, "item": f"item-{i}", "state": "pending"}
        if i % 3 == 0:
            end = {"t": "end", "attempt": 1, "state": "done", "ok": True, "at": 1.0, "dur": 0.5}
            entry.update(state="done", attempts=1, history=[{**end, "exit": 0}])
        entries.append(entry)
    header = {"statequeue_export": 1, "queue": "src", "items": ITEMS, "paused": False}
    lines = [json.dumps(header)] + [json.dumps(e) for e in entries]
    path.write_text("\n".join(lines) + "\n")
    return entries


def _imported(url: str) -> int:
    [(n,)] = _sql(url, "SELECT count(*) FROM statequeue.items WHERE queue = 'q'")
    assert isinstance(n, int)
    return n


def _kill_mid_import(env: dict[str, str], export: Path, url: str) -> int:
    """Start the import, SIGKILL it once some of it committed; items it left."""
    proc = subprocess.Popen(
        [STATEQUEUE, "import", "-q", "q", str(export)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        end = time.monotonic() + DEADLINE
        while _sql(url, "SELECT to_regclass('statequeue.items')")[0][0] is None or not _imported(
            url
        ):
            assert proc.poll() is None, "the import ended before any of it was seen"
            assert time.monotonic() < end, "gave up waiting for the import to begin"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    return _imported(url)


def test_an_import_killed_mid_way_leaves_whole_items_and_a_rerun_completes_it(
    pg_url: str, sq_env: dict[str, str], tmp_path: Path
) -> None:
    export = tmp_path / "export.ndjson"
    entries = _export(export)
    env = dict(sq_env, STATEQUEUE_STORE=pg_url)
    left = _kill_mid_import(env, export, pg_url)
    assert 0 < left < ITEMS, "the kill did not land mid-import"
    # Whole batches only: each committed with its items' results and counts.
    assert left % IMPORT_BATCH == 0
    with Queue("q", home=tmp_path, store=pg_url, create=False) as q:
        assert not q.fsck().damaged  # the counters agree with a recount
        done = [e["id"] for e in entries if e["state"] == "done" and e["id"] <= left]
        results = _sql(pg_url, "SELECT id FROM statequeue.results WHERE queue = 'q' ORDER BY id")
        assert [r[0] for r in results] == done
        assert q.status().counts.get("done", 0) == len(done)
    rerun = subprocess.run(
        [STATEQUEUE, "import", "-q", "q", "--json", str(export)],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert rerun.returncode == 0, rerun.stderr.decode()
    assert json.loads(rerun.stdout)["added"] == ITEMS - left
    with Queue("q", home=tmp_path, store=pg_url, create=False) as q:
        views = list(q.items())
        assert [(v.item_id, v.item, v.state.value) for v in views] == [
            (e["id"], e["item"], e["state"]) for e in entries
        ]
        assert not q.fsck().damaged
        assert q.status().counts.get("done", 0) == ITEMS // 3
