"""`Queue.work(rate=...)` returns after its last item, not one rate period later.

The loop took a start from the queue's rate before each claim, so its last
claim, which finds nothing, first slept a whole period for a start it never
used (one item at rate="1/h" returned after an hour, and the start was lost
to the queue's other runners). Now nothing pending means no start is taken.
In a subprocess that must end well within the hour."""

from __future__ import annotations

import subprocess
import sys

Env = dict[str, str]

SCRIPT = """
import statequeue
with statequeue.Queue("hourly") as q:
    q.enqueue(["abc"])
    seen = []
    for item in q.work(rate="1/h"):
        with item:
            seen.append(item.item)
    print(seen, q.status().counts["done"])
"""


def test_a_rate_limited_work_loop_returns_after_its_last_item(sq_env: Env) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=60,  # an hour before the fix
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "['abc'] 1\n"
