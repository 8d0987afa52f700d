"""`run --persistent` with a command the kernel cannot start (a #! line naming
a missing interpreter, a file with no #! line that is no program): as a
missing program is for `run`, one line naming it and exit 2; its items go
back to pending uncounted. It was a Python traceback in the item's log, a
crash charged to the item twice, and exit 13. Real CLI, both stores (the
keeper process and the runner's own keeper start the workers)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from statequeue import Queue
from statequeue.core.exitcodes import ExitCode
from statequeue.core.models import ItemState
from tests.conftest import STATEQUEUE

RUN_TIMEOUT = 60


@pytest.mark.parametrize(
    ("text", "says"),
    [
        # Refused before anything is claimed (run/checks.py, start_problem).
        (
            "#!/nonexistent/interpreter\necho hi\n",
            "the interpreter its #! line names is missing: /nonexistent/interpreter",
        ),
        ("echo no shebang line\n", "it has no #! line"),
        # Past that check (the head of a program), refused by the system at the start.
        ("\x7fELF not really a program\n", "Exec format error"),
    ],
)
def test_a_worker_that_cannot_start_is_one_line_and_exit_2_with_nothing_charged(
    sq_home: Path, sq_env: dict[str, str], tmp_path: Path, store_url: str, text: str, says: str
) -> None:
    program = tmp_path / "worker"
    program.write_text(text)
    program.chmod(0o755)
    with Queue(home=sq_home, store=store_url or None) as q:
        q.enqueue(["a", "b", "c"])
    env = dict(sq_env, STATEQUEUE_STORE=store_url) if store_url else sq_env
    for jobs in ("1", "2"):
        argv = [STATEQUEUE, "run", "--persistent", "-j", jobs, "--", str(program)]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
        assert done.returncode == ExitCode.USAGE, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"statequeue: cannot start command '{program}': {says}")
        with Queue(home=sq_home, store=store_url or None) as q:
            views = list(q.items())
            assert [(v.state, v.attempts) for v in views] == [(ItemState.PENDING, 0)] * 3
            for view in views:
                history = str(q.history(view.item).events)
                assert "interrupted" not in history and "crash" not in history, history
                assert "Traceback" not in (q.read_log(view.item_id, 1) or b"").decode()


def test_a_json_run_stopped_before_any_attempt_still_prints_its_object(
    sq_env: dict[str, str],
) -> None:
    """`run --json` promises its summary object, then the error's line; a
    worker that exits before reading any request stopped the run (exit 13)
    with no object at all (an outside new user)."""
    assert subprocess.run([STATEQUEUE, "enqueue", "a"], env=sq_env, check=False).returncode == 0
    argv = [STATEQUEUE, "run", "--json", "--persistent", "--", "true"]
    done = subprocess.run(argv, env=sq_env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == ExitCode.WORKER_BROKEN, done.stderr
    summary = json.loads(done.stdout)
    assert summary["exit_code"] == ExitCode.WORKER_BROKEN and summary["attempts"] == 0
