"""Items a dead runner's processes still run: `status` and the next `run` say so.

Found by an outside tester: after a kill -9 of a run's runner AND its keeper,
the items' own processes lived on under init, holding the items' claims.
`status` showed "running 2", "runner: none active" and no word of them, and
the next `run` exited 0 with "items: 1 ok", silent about the 2 items it
could not take. (On PostgreSQL `status` even listed them as interrupted,
"the next run recovers them", which the next run then did not: recovery
waits while a process holds an item's claim lock on this host.)

`status` now lists them apart ("still run by processes of a dead runner"),
in --json as "held_by_dead_runner", and the run's summary line names them.
Once those processes end, the items are interrupted and the next run
recovers them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from statequeue import Queue
from tests.conftest import STATEQUEUE
from tests.killed_run import run_killed_running_two, stop_item_processes
from tests.waiting import until


def _cli(sq_env: dict[str, str], store_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    store = ["--store", store_url] if store_url else []
    return subprocess.run(
        [STATEQUEUE, *store, *args], env=sq_env, capture_output=True, text=True, timeout=120
    )


def test_items_a_dead_runners_processes_hold_are_named(
    sq_env: dict[str, str], sq_home: Path, store_url: str, tmp_path: Path
) -> None:
    items = ["a", "b", "c"]
    with run_killed_running_two(sq_env, sq_home, store_url, tmp_path, items, keeper_too=True):
        text = _cli(sq_env, store_url, "status").stdout
        assert (
            "still run by processes of a dead runner (no run takes them until those end; "
            "then the next run recovers them): 2 items: #1, #2" in text
        ), text
        assert "interrupted (" not in text, text
        as_json = json.loads(_cli(sq_env, store_url, "status", "--json").stdout)
        assert as_json["held_by_dead_runner"] == [1, 2] and as_json["interrupted"] == []
        with Queue(home=sq_home, store=store_url or None, create=False) as q:
            found = q.status()
            assert (found.held_by_dead_runner, found.interrupted) == ((1, 2), ())
            assert q.store.held_by_dead_runner() == (1, 2) and q.store.interrupted() == ()
        # `list` and `show` say it as `status` does.
        listed = _cli(sq_env, store_url, "list", "--state", "running").stdout.splitlines()
        assert [line.split("\t")[:2] for line in listed] == [["1", "orphaned"], ["2", "orphaned"]]
        rows = [json.loads(r) for r in _cli(sq_env, store_url, "list", "--json").stdout.split()]
        marked = {r["id"]: (r["state"], r["held_by_dead_runner"], r["interrupted"]) for r in rows}
        assert marked == {
            1: ("running", True, False),
            2: ("running", True, False),
            3: ("pending", False, False),
        }
        shown = _cli(sq_env, store_url, "show", "1").stdout
        assert "state: running (orphaned: its runner died during attempt 1, whose" in shown, shown
        ran = _cli(sq_env, store_url, "run", "--", "true")
        assert ran.returncode == 0, ran.stderr
        assert (
            "items: 1 ok, 0 failed; 1 attempt started; not taken: 2 items still run by "
            "processes of a dead runner (`statequeue status`): #1, #2" in ran.stderr
        ), ran.stderr
        stop_item_processes(tmp_path)  # they end: the items are the next run's
        with Queue(home=sq_home, store=store_url or None, create=False) as q:
            until(lambda: q.status().interrupted == (1, 2), "1 and 2 interrupted")
            assert q.status().held_by_dead_runner == ()
        ran = _cli(sq_env, store_url, "run", "--", "true")
        assert ran.returncode == 0, ran.stderr
        assert "items: 2 ok, 0 failed; 2 attempts started\n" in ran.stderr, ran.stderr
