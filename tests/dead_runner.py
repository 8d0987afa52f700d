"""A runner that dies holding claims, on either store: for tests of what the
next command does with the items it left (status: interrupted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# Claims items 1 and 2, then dies with both claimed: its runner is gone.
_DIE_HOLDING = """
import os, sys
from statequeue import Queue
from statequeue.core.identity import new_runner
q = Queue(home=sys.argv[1], store=sys.argv[2] or None)
runner = new_runner()
q.register_runner(runner)
q.claim(runner)
q.claim(runner)
os._exit(0)
"""


def die_holding_two(sq_env: dict[str, str], sq_home: Path, store_url: str) -> None:
    """Claim items 1 and 2 in a process that then dies (os._exit)."""
    died = subprocess.run(
        [sys.executable, "-c", _DIE_HOLDING, str(sq_home), store_url], env=sq_env, check=False
    )
    assert died.returncode == 0
