"""`stats` names the items a dead runner left as `status` does: interrupted.

With no runner alive, `stats` said "(1 pending, 2 running)" while `status`
listed the same two as interrupted (found by an outside tester).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from statequeue import Queue
from tests.conftest import STATEQUEUE
from tests.dead_runner import die_holding_two


def test_stats_calls_a_dead_runner_s_items_interrupted(
    sq_env: dict[str, str], sq_home: Path
) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a", "b", "c"])
    die_holding_two(sq_env, sq_home, "")
    out = subprocess.run(
        [STATEQUEUE, "stats"], env=sq_env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].endswith("(1 pending, 2 interrupted)"), out.stdout
