"""A huge item is cut on `run`'s plain progress lines (outside tester: a
64 KiB item was printed whole in every `[ok]` line, filling logs and cron
mail); its "#ID" still names it, and `show --json` has it whole."""

from __future__ import annotations

import json
import subprocess

from tests.conftest import STATEQUEUE

DEADLINE = 60.0


def test_a_huge_item_is_cut_on_progress_lines(sq_env: dict[str, str]) -> None:
    item = "x" * 5000
    subprocess.run(
        [STATEQUEUE, "enqueue"],
        input=item + "\n",
        env=sq_env,
        text=True,
        check=True,
        timeout=DEADLINE,
    )
    run = subprocess.run(
        [STATEQUEUE, "run", "--no-live", "--", "true"],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert run.returncode == 0, run.stderr
    line = next(x for x in run.stderr.splitlines() if x.startswith("[ok] #1 "))
    assert line.startswith("[ok] #1 xxx") and "…" in line
    assert len(line) < 2100, len(line)
    shown = subprocess.run(
        [STATEQUEUE, "show", "1", "--json"],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert json.loads(shown.stdout)["item"] == item
