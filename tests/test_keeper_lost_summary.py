"""kill -9 of a run's keeper process: the run stops with exit 1 and its one
line, and says its summary too, what was done before the keeper died
(outside tester: no `items: ...` line was printed). On both stores."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import cast

from tests.conftest import STATEQUEUE
from tests.waiting import until

DEADLINE = 60.0
# Item a is done at once; item b writes a mark and sleeps.
ITEM = 'case $1 in a) exit 0;; *) touch "$MARK"; exec sleep 60;; esac'


def _keeper_of(runner: int) -> int | None:
    for task in os.listdir(f"/proc/{runner}/task"):
        with contextlib.suppress(FileNotFoundError):
            for pid in Path(f"/proc/{runner}/task/{task}/children").read_text().split():
                with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                    if b"keeper_process.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        return int(pid)
    return None


def _run_and_kill_keeper(env: dict[str, str], *options: str) -> tuple[int, str, str]:
    for item in ("a", "b"):
        subprocess.run([STATEQUEUE, "enqueue", item], env=env, check=True, timeout=DEADLINE)
    run = subprocess.Popen(
        [STATEQUEUE, "run", "--no-live", *options, "--", "sh", "-c", ITEM, "sh"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        until(lambda: Path(env["MARK"]).exists(), "item b to start")
        keeper = until(lambda: _keeper_of(run.pid), "the run's keeper")
        os.kill(cast(int, keeper), signal.SIGKILL)
        out, err = run.communicate(timeout=DEADLINE)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    return run.returncode, out, err


def test_a_run_whose_keeper_died_says_its_summary(
    sq_env: dict[str, str], store_url: str, tmp_path: Path
) -> None:
    env = dict(sq_env, MARK=str(tmp_path / "b.started"))
    if store_url:
        env["STATEQUEUE_STORE"] = store_url
    code, _, err = _run_and_kill_keeper(env)
    assert code == 1, err
    lines = err.splitlines()
    # Item b was in flight when the keeper died: named as cut short.
    summary = "statequeue: items: 1 ok, 0 failed, 1 cut short by the error"
    assert any(line.startswith(summary) and "2 attempts started" in line for line in lines), err
    assert lines[-1].startswith("statequeue: the run's keeper process ended unexpectedly"), err


def test_with_json_the_summary_object_is_printed(sq_env: dict[str, str], tmp_path: Path) -> None:
    code, out, err = _run_and_kill_keeper(dict(sq_env, MARK=str(tmp_path / "b.started")), "--json")
    assert code == 1, err
    summary = json.loads(out)
    assert (summary["succeeded"], summary["attempts"], summary["exit_code"]) == (1, 2, 1), summary
    assert "keeper process ended unexpectedly" in err
