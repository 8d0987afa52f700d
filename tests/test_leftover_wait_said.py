"""A later run says what it waits for when a leftover of an earlier attempt
keeps an item's claim (promise 4), and `status` shows it.

Each item's command leaves a detached process that nothing marks as the
item's (tests/leftovers.py), then fails. The run ends; its
keeper stays and holds both items' claims until that process is gone. After
``retry --failed``, a second run waited for those claims without a word and
looked hung. Now the keeper notes the pids it waits for, the waiting run
says so once per item, and `status` lists the items with those pids.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from pathlib import Path

from statequeue import Queue
from tests.conftest import STATEQUEUE
from tests.leftovers import CHECK, COMMAND, leftover_pid, sq
from tests.waiting import gone, until


def _leftovers(sq_env: dict[str, str]) -> list[dict[str, object]]:
    done = sq(sq_env, "status", "--json")
    assert done.returncode == 0, done.stderr
    found: list[dict[str, object]] = json.loads(done.stdout).get("leftovers", [])
    return found


def test_a_run_says_which_leftover_it_waits_for(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path
) -> None:
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    with Queue(home=sq_home) as q:
        q.enqueue(["a", "b"])
    first = sq(sq_env, "run", "-j2", "--", "sh", "-c", COMMAND, str(pids_dir), "{}")
    assert first.returncode == 1, first.stderr
    pids = {
        name: int(until(lambda n=name: leftover_pid(pids_dir / n), f"the pid of {name}'s leftover"))
        for name in ("a", "b")
    }
    second: subprocess.Popen[str] | None = None
    try:
        assert sq(sq_env, "retry", "--failed").returncode == 0
        # Both claims are held by the first run's keeper, which notes the
        # processes it waits for (here, most likely every one for each item:
        # nothing in them says whose they are).
        seen: list[object] = []

        def both_noted() -> list[dict[str, object]] | None:
            found = _leftovers(sq_env)
            seen[:] = [found]  # what the last look saw, for a failure's message
            return found if len(found) == 2 else None

        try:
            noted = until(both_noted, "the note")
        except AssertionError:
            status = sq(sq_env, "status").stdout
            raise AssertionError(f"no note of both items: last {seen}; status: {status}") from None
        by_item = {entry["id"]: entry["pids"] for entry in noted}  # type: ignore[union-attr]
        assert sorted(by_item) == [1, 2], noted
        assert {p for listed in by_item.values() for p in listed} == set(pids.values()), noted
        human = sq(sq_env, "status")
        assert "pending, waiting for a process of an earlier attempt to end" in human.stdout

        argv = [STATEQUEUE, "run", "-j2", "--", "sh", "-c", CHECK, str(pids_dir)]
        second = subprocess.Popen(argv, env=sq_env, stderr=subprocess.PIPE, text=True)
        lines: list[str] = []
        assert second.stderr is not None
        reader = threading.Thread(target=lambda: lines.extend(second.stderr or ()), daemon=True)
        reader.start()
        for item in (1, 2):
            said = f"statequeue: waiting for item {item}: pid"
            line = until(
                lambda s=said: next((x for x in lines if x.startswith(s)), None), f"{item}'s line"
            )
            assert all(str(p) in str(line) for p in by_item[item]), line
            assert "of its earlier attempt still run" in str(line), line
        assert second.poll() is None, lines  # it waits: nothing of either item ran
    finally:
        for pid in pids.values():
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
    assert second is not None
    assert second.wait(timeout=120) == 0, lines  # each ran once its leftovers were gone
    reader.join(timeout=60)
    waits = [line for line in lines if "waiting for item" in line]
    assert len(waits) == 2, lines  # once per item, not once per look
    assert all(line.endswith("or wait)\n") for line in waits), waits
    assert _leftovers(sq_env) == []
    with Queue(home=sq_home, create=False) as q:
        assert {v.item: v.state.value for v in q.store.items()} == {"a": "done", "b": "done"}
