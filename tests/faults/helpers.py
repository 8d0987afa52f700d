"""Building blocks for the fault-injection layer: a known queue, and what to compare."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from statequeue.store.journal.store import JOURNAL, JournalStore


def build_queue(folder: Path, *, items: int = 8, finished: int = 5) -> bytes:
    """A queue with ``items`` enqueued and ``finished`` of them done; returns its journal."""
    store = JournalStore(folder, create=True)
    store.enqueue([f"item-{i}" for i in range(items)])
    runner = new_runner()
    for _ in range(finished):
        claim = store.claim(runner)
        assert claim is not None
        store.finish(claim, Outcome(ok=True, result={"id": claim.item_id}))
    store.close()
    return (folder / JOURNAL).read_bytes()


def fingerprint(store: JournalStore) -> tuple[object, ...]:
    """Everything a user can observe about the queue's state."""
    st = store.state
    items = [st.get(i) for i in st.live_ids()]
    live = sorted((i.id, i.text, i.state.value, i.attempts) for i in items if i is not None)
    every = [(v.item_id, v.item, v.state.value) for v in store.items()]
    return (dict(store.status().counts), live, every, st.next_id)


def record_starts(data: bytes) -> list[int]:
    """Byte offsets where each record (line) starts."""
    starts = [0]
    pos = data.find(b"\n")
    while pos != -1 and pos + 1 < len(data):
        starts.append(pos + 1)
        pos = data.find(b"\n", pos + 1)
    return starts


def fresh_folder(root: Path, name: str, journal: bytes) -> Path:
    folder = root / name
    folder.mkdir(mode=0o700)
    (folder / JOURNAL).write_bytes(journal)
    return folder


def on_a_small_disk(tmp_path: Path, script: str, *args: str) -> dict[str, str]:
    """Run the shell ``script`` with a small tmpfs mounted (by the script, at
    its ``$1``) in a private mount namespace, with ``args`` after it and
    `statequeue` on PATH; its ``key=value`` output lines as a dict. Skipped
    where no tmpfs can be mounted so (the script exits 77 then)."""
    # lazy: a module of fixtures imports this one
    from tests.conftest import BIN

    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        pytest.skip("needs Linux and unshare(1) to mount a private tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    path = tmp_path / "small-disk.sh"
    path.write_text(script)
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1"}
    if "PYTHONPATH" in os.environ:  # a checkout under test other than the installed one
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    proc = subprocess.run(
        ["unshare", "-Urm", "sh", str(path), str(mnt), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode == 77 or "Operation not permitted" in proc.stderr:
        pytest.skip(f"this machine cannot mount a tmpfs in a user namespace: {proc.stderr.strip()}")
    out = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    out["_stdout"] = proc.stdout
    return out
