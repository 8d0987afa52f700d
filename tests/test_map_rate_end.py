"""`statequeue.map(..., rate=...)` returned one rate period after its last
item: each slot took a start from the rate before looking for an item, and
the last slot, finding none left, first slept for a start it would not use
(a map of one item at rate="1/h" returned after an hour). Now a slot that has
nothing left to claim ends without taking a start. Runs in a subprocess
that must end well within the hour."""

from __future__ import annotations

import subprocess
import sys

import pytest

Env = dict[str, str]

SCRIPT = """
import asyncio, sys
import statequeue

async def size(text):
    return len(text)

if sys.argv[1] == "map":
    print(statequeue.map(len, ["abc"], queue="hourly", rate="1/h"))
else:
    print(asyncio.run(statequeue.map_async(size, ["abc"], queue="hourly-a", rate="1/h")))
"""


@pytest.mark.parametrize("which", ["map", "map_async"])
def test_a_rate_limited_map_returns_after_its_last_item(sq_env: Env, which: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, which],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=60,  # an hour before the fix
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[3]\n"
