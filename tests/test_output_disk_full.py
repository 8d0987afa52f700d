"""`export -o` and `report -o` on a full disk (/dev/full: every write is
ENOSPC): exit 6 with the one disk-full line every command gives, and a
remedy about the disk of the file named, not the queue's (outside tester:
`export` advised `compact --keep-logs 0s`; `report` said `error: PATH: No
space left on device`, unlike every other disk-full message)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import STATEQUEUE

DEADLINE = 60.0
FULL = Path("/dev/full")


@pytest.mark.skipif(not FULL.exists(), reason="needs /dev/full")
@pytest.mark.parametrize("command", ["export", "report"])
def test_an_output_on_a_full_disk_says_to_free_space_there(
    sq_env: dict[str, str], command: str
) -> None:
    subprocess.run([STATEQUEUE, "enqueue", "a"], env=sq_env, check=True, timeout=DEADLINE)
    done = subprocess.run(
        [STATEQUEUE, command, "-o", str(FULL)],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 6, done.stderr
    assert done.stderr.splitlines() == [
        f"statequeue: writing {FULL} failed: disk full; stopped without acknowledging "
        f"(free space on the disk of {FULL})"
    ], done.stderr
