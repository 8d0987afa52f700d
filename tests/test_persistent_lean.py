"""Issue 23's per-request cost: a worker written with ``statequeue.serve`` starts
without the store's modules (``api.work`` brings them, for one helper used only
when fn raises), so each worker, persistent or per item, starts sooner."""

from __future__ import annotations

import json
import subprocess
import sys

SHOW_IMPORTED = """
import json, sys
import statequeue
statequeue.serve  # what a worker file touches before its first item
print(json.dumps(sorted(m for m in sys.modules if m.startswith("statequeue."))))
"""


def test_a_serve_worker_imports_no_store_module_at_start() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SHOW_IMPORTED], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    imported = json.loads(done.stdout)
    assert "statequeue.api.serve" in imported
    heavy = [m for m in imported if m.startswith("statequeue.store") or m == "statequeue.api.work"]
    assert not heavy, heavy
