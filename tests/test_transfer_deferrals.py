"""`export` / `import` keep an item's deferrals, and `show` says it was imported.

Found by an outside tester: an item that had asked to be tried later
(``TryLater``, exit 75, a worker's "later") lost its deferral count on the
way through `export` and `import` (while its attempt count survived): the
new queue's `status` no longer said "deferred N", `stats` no longer counted
the deferrals, `show` no longer listed them, and ``--max-deferrals`` counted
from zero again. And `show` said the imported item was "carried over by
compaction", which never happened. Both stores, there and back.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from statequeue.api.queue import Queue
from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, Outcome
from tests.conftest import STATEQUEUE

Env = dict[str, str]
LATER = Outcome(ok=False, exit_code=75, reason="try later")


def _sq(env: Env, *args: str, stdin: bytes = b"") -> bytes:
    done = subprocess.run(
        [STATEQUEUE, *args], input=stdin, env=env, capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, (args, done.stderr.decode())
    return done.stdout


def _defer(q: Queue, times: int, *, most: int = 5) -> ItemState:
    """Item 1 claimed and deferred ``times`` times (due at once); its last state."""
    state = ItemState.PENDING
    for _ in range(times):
        claim = q.claim(new_runner())
        assert claim is not None and claim.item_id == 1
        state = q.defer(claim, LATER, delay=0.0, max_deferrals=most)
    return state


def _exported(data: bytes) -> dict[str, object]:
    entry: dict[str, object] = json.loads(data.splitlines()[1])
    return entry


def test_deferrals_survive_export_and_import_through_postgresql(
    pg_url: str, sq_env: Env, sq_home: Path
) -> None:
    with Queue("src", home=sq_home) as q:
        q.enqueue(["a"])
        _defer(q, 2)
    export = _sq(sq_env, "export", "-q", "src")
    entry = _exported(export)
    assert entry["deferrals"] == 2 and entry["attempts"] == 2, entry
    assert [h["t"] for h in entry["history"]] == ["defer", "defer"], entry  # type: ignore[union-attr]
    pg = ("--store", pg_url)
    _sq(sq_env, *pg, "import", "-q", "moved", stdin=export)
    back = _sq(sq_env, *pg, "export", "-q", "moved")
    assert _exported(back)["deferrals"] == 2, back
    _sq(sq_env, "import", "-q", "back", stdin=back)
    for queue, store in (("moved", pg_url), ("back", None)):
        with Queue(queue, home=sq_home, store=store, create=False) as q:
            assert q.status().deferred == 1, queue  # `status`: "deferred 1"
            assert q.stats().deferred == 2, queue  # `stats`: the deferrals recorded
            # --max-deferrals counts on from 2: a third deferral is past 2.
            assert _defer(q, 1, most=2) is ItemState.FAILED, queue


def test_show_says_an_imported_item_was_imported(sq_env: Env, sq_home: Path) -> None:
    with Queue("src", home=sq_home) as q:
        q.enqueue(["a"])
        _defer(q, 1)
    _sq(sq_env, "import", "-q", "copy", stdin=_sq(sq_env, "export", "-q", "src"))
    shown = _sq(sq_env, "show", "-q", "copy", "1").decode()
    assert "#1 imported: pending" in shown, shown
    assert "compaction" not in shown, shown
    assert "deferred #1 attempt 1: asked to be tried later" in shown, shown
    with Queue("copy", home=sq_home, create=False) as q:
        q.pause()  # records to drop: a compaction that gains nothing is not put in place
        q.resume()
    _sq(sq_env, "compact", "-q", "copy")  # a compaction then carries it over, and says so
    shown = _sq(sq_env, "show", "-q", "copy", "1").decode()
    assert "#1 carried over by compaction: pending" in shown, shown
    assert "deferred #1 attempt 1" in shown, shown
