"""Help and reference text that disagreed with what the command does, found
by an outside tester: each is checked against the behaviour here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from statequeue.api.queue import Queue
from statequeue.core.exitcodes import ExitCode
from tests.conftest import STATEQUEUE

TOPICS = Path(__file__).resolve().parent.parent / "statequeue" / "cli" / "topics"


def test_results_state_help_names_the_states_it_takes(sq_env: dict[str, str]) -> None:
    """`results --help` listed every state; all but done and failed are refused."""
    shown = subprocess.run(
        [STATEQUEUE, "results", "--help"],
        env={**sq_env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = next(x for x in shown.stdout.splitlines() if "--state  " in x)
    assert "done or failed" in line and "pending" not in line, line
    with Queue("r") as q:
        q.enqueue(["a"])
    for state, code in (("pending", ExitCode.USAGE), ("done", 0), ("failed", 0)):
        done = subprocess.run(
            [STATEQUEUE, "-q", "r", "results", "-s", state],
            env=sq_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == code, (state, done.stderr)


def test_the_postgres_page_gives_drop_s_refusal_its_exit_code() -> None:
    """It said exit 2; `drop` exits 4 (RunnerActive) on both stores."""
    page = (TOPICS / "postgres.md").read_text()
    said = re.search(r"refuses while a runner is active on the queue \(exit\s+(\d+)\)", page)
    assert said is not None and int(said.group(1)) == ExitCode.RUNNER_ACTIVE
