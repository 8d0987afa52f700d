"""A real full disk: a small tmpfs mounted in a private mount namespace.

The worker fills the disk part-way through a run. The runner must stop with a
clear one-line error (exit 6) and lose nothing; once space is freed, the next
run finishes every item.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.faults.helpers import on_a_small_disk

SCRIPT = r"""
set -u
mnt="$1"; n="$2"
mount -t tmpfs -o size=2m tmpfs "$mnt" || exit 77
export STATEQUEUE_HOME="$mnt/home"
seq "$n" | statequeue enqueue >/dev/null
# Item 5 fills the disk; later appends to the journal then fail with ENOSPC.
worker='if [ "$0" = 5 ]; then dd if=/dev/zero of="$1/filler" bs=64k 2>/dev/null; fi; true'
statequeue run --no-live -- sh -c "$worker" {} "$mnt" 2>"$mnt/err1"
echo "first_rc=$?"
echo "first_err=$(tail -n 1 "$mnt/err1")"
echo "acked=$(grep -c '^\[ok\]' "$mnt/err1")"
rm -f "$mnt/filler"
statequeue run --no-live -- true 2>/dev/null
echo "second_rc=$?"
echo "status=$(statequeue status --json)"
"""


def test_full_disk_loses_nothing_and_resumes(tmp_path: Path) -> None:
    out = on_a_small_disk(tmp_path, SCRIPT, "40")
    assert out["first_rc"] == "6", out["_stdout"]
    assert "disk full" in out["first_err"] and out["first_err"].startswith("statequeue: ")
    assert out["second_rc"] == "0", out["_stdout"]
    status = json.loads(out["status"])
    assert status["counts"]["done"] == 40 and status["counts"]["failed"] == 0
    # Items 1-4 finished before the disk filled. Item 5's own end record is
    # acknowledged only if it fits in the slack of the journal's last tmpfs
    # page, which depends on record sizes (ends name runner and host since
    # issue 15), so it is not counted on.
    assert int(out["acked"]) >= 4
