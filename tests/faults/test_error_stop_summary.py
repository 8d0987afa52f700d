"""A run stopped by an error still says what it did before it: its summary
line, naming the items the error cut short, then the error's own line, and
the error's exit code (a full disk: 6). Before, only the error's line was
printed: an operator could not tell what had been done, nor that an item in
flight was stopped. On a real full disk: a small tmpfs in a private mount
namespace, as test_enospc.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.faults.helpers import on_a_small_disk

SCRIPT = r"""
set -u
mnt="$1"; json="$2"; out="$3"  # $out: not on the small disk
mount -t tmpfs -o size=2m tmpfs "$mnt" || exit 77
export STATEQUEUE_HOME="$mnt/home"
seq 60 | statequeue enqueue >/dev/null
# Item 5 fills the disk; item 6, beside it with -j2, sleeps through what
# follows: the items after it run in the other slot until the slack of the
# journal's last tmpfs page is used up and an append fails.
worker='case $0 in 5) dd if=/dev/zero of="$1/filler" bs=64k 2>/dev/null;; 6) sleep 30;; esac; true'
statequeue run --no-live -j2 $json -- sh -c "$worker" {} "$mnt" >"$out/out" 2>"$out/err"
echo "rc=$?"
echo "summary=$(grep -v '^\[ok\]' "$out/err" | head -n 1)"
echo "last=$(tail -n 1 "$out/err")"
echo "json=$(cat "$out/out")"
rm -f "$mnt/filler"
statequeue run --no-live -- true 2>/dev/null
echo "second_rc=$?"
echo "status=$(statequeue status --json)"
"""


def _run(tmp_path: Path, json_flag: str) -> dict[str, str]:
    out = on_a_small_disk(tmp_path, SCRIPT, json_flag, str(tmp_path))
    assert out["rc"] == "6", out["_stdout"]
    assert out["last"].startswith("statequeue: ") and "disk full" in out["last"], out["_stdout"]
    # Nothing lost: once space is freed, every item ends done.
    assert out["second_rc"] == "0", out["_stdout"]
    assert json.loads(out["status"])["counts"]["done"] == 60, out["_stdout"]
    return out


def test_a_run_stopped_by_a_full_disk_says_its_summary_first(tmp_path: Path) -> None:
    out = _run(tmp_path, "")
    summary = out["summary"]
    assert summary.startswith("statequeue: items: "), out
    assert "ok" in summary and "disk full" not in summary, out
    # Item 6 was in flight, and the item whose end record failed was not
    # acknowledged: both named as cut short.
    assert "2 cut short by the error" in summary, out


def test_its_json_summary_lists_the_items_cut_short(tmp_path: Path) -> None:
    out = _run(tmp_path, "--json")
    summary = json.loads(out["json"])
    cut = summary["cut_short"]
    assert len(cut) == 2 and 6 in cut, out
    assert summary["succeeded"] >= 4 and summary["exit_code"] == 6, out
