"""`list` and `show` after a kill -9 of a run, before the next run recovers
its items: they mark the items `status` lists as interrupted.

Found by an outside tester: `status` said "interrupted (runner died; the
next run recovers them): 2 items: #1, #2" while `list` printed "1 running 1
a" and `show` "state: running", with no word of the dead runner. Both now
take the rule from the store's ``interrupted`` (the part of ``status`` that
decides it, one rule per store): `list` prints "interrupted" in the state
column, `show` says the runner died and the next run recovers the item, and
their --json keeps "state": "running" and adds "interrupted": true.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from statequeue import Queue
from statequeue.core.identity import new_runner
from tests.conftest import STATEQUEUE
from tests.killed_run import run_killed_running_two


def _cli(sq_env: dict[str, str], store_url: str, *args: str) -> str:
    store = ["--store", store_url] if store_url else []
    done = subprocess.run(
        [STATEQUEUE, *store, *args], env=sq_env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_list_and_show_mark_the_items_of_a_dead_runner(
    sq_env: dict[str, str], sq_home: Path, store_url: str, tmp_path: Path
) -> None:
    with run_killed_running_two(sq_env, sq_home, store_url, tmp_path, ["a", "b", "c", "d"]):
        listed = _cli(sq_env, store_url, "list")
        assert listed.splitlines() == [
            "1\tinterrupted\t1\ta",
            "2\tinterrupted\t1\tb",
            "3\tpending\t0\tc",
            "4\tpending\t0\td",
        ], listed
        running = _cli(sq_env, store_url, "list", "--state", "running")
        assert running.splitlines() == ["1\tinterrupted\t1\ta", "2\tinterrupted\t1\tb"]
        rows = _json_lines(_cli(sq_env, store_url, "list", "--json"))
        assert [(r["id"], r["state"], r["interrupted"]) for r in rows] == [
            (1, "running", True),
            (2, "running", True),
            (3, "pending", False),
            (4, "pending", False),
        ]
        shown = _cli(sq_env, store_url, "show", "--item", "a")
        assert (
            "state: running (interrupted: its runner died during attempt 1; "
            "the next run recovers it)\n" in shown
        ), shown
        one = json.loads(_cli(sq_env, store_url, "show", "2", "--json"))
        assert (one["state"], one["interrupted"]) == ("running", True)
        with Queue(home=sq_home, store=store_url or None, create=False) as q:
            assert [v.item_id for v in q.items() if v.interrupted] == [1, 2]
            q.store.recover()  # what the next run does first
        listed = _cli(sq_env, store_url, "list")
        assert "interrupted" not in listed and "running" not in listed, listed


def test_a_live_runners_items_are_only_running(
    sq_env: dict[str, str], sq_home: Path, store_url: str
) -> None:
    with Queue(home=sq_home, store=store_url or None) as q:
        q.enqueue(["a", "b"])
        runner = new_runner()
        q.register_runner(runner)
        assert q.claim(runner) is not None
        assert _cli(sq_env, store_url, "list").splitlines()[0] == "1\trunning\t1\ta"
        shown = _cli(sq_env, store_url, "show", "1")
        assert "state: running\n" in shown and "interrupted" not in shown, shown
        assert json.loads(_cli(sq_env, store_url, "show", "1", "--json"))["interrupted"] is False
