"""An item's command that leaves a detached leftover which the keeper alone
can tell from an unrelated process: a new session, its environment wiped (no
STATEQUEUE_ID), its fds closed (it holds no claim itself); it notes its pid
under the item's name and sleeps far longer than any test waits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import STATEQUEUE

_LEFTOVER = (
    "import os, sys, time; os.closerange(3, 65536); os.setsid();"
    " open(os.path.join(sys.argv[1], sys.argv[2]), 'w').write(str(os.getpid()));"
    " time.sleep(300)"
)
COMMAND = f'env -i {sys.executable} -c "{_LEFTOVER}" "$0" "$1" </dev/null >/dev/null 2>&1 & exit 1'
"""``sh -c COMMAND PIDS_DIR {}``: leaves the leftover, then fails."""
CHECK = 'for f in "$0"/*; do kill -0 "$(cat "$f")" 2>/dev/null && exit 9; done; exit 0'
"""``sh -c CHECK PIDS_DIR``: fails (exit 9) if any leftover still runs."""


def sq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def leftover_pid(path: Path) -> int | None:
    """The pid a leftover noted in ``path`` (None until it has)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return int(text) if text else None
