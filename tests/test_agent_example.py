"""scripts/agent_example.py: killed with -9 part-way, then resumed (issue 13 point 7)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from statequeue import ItemState, Queue

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "agent_example.py"
ARGS = ["--tasks", "60", "--concurrency", "6", "--latency", "0.02", "--fail-rate", "0.1"]


def lines(log: Path) -> list[tuple[str, str]]:
    if not log.exists():
        return []
    return [tuple(line.split(" ", 1)) for line in log.read_text().splitlines()]  # type: ignore[misc]


def test_agent_example_resumes_after_kill_9(tmp_path: Path, sq_env: dict[str, str]) -> None:
    log = tmp_path / "calls.log"
    argv = [sys.executable, str(SCRIPT), *ARGS, "--log", str(log)]
    proc = subprocess.Popen(argv, env=sq_env, stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while sum(1 for what, _ in lines(log) if what == "end") < 10:
            assert proc.poll() is None, "it finished before the kill"
            assert time.monotonic() < deadline, "no progress"
            time.sleep(0.01)  # polling the log for progress
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.stdout is not None
    assert b"run me again to resume" in proc.stdout.read()
    first = lines(log)
    with Queue("agent-example", create=False) as q:
        done_first = {v.item for v in q.items(ItemState.DONE)}
    assert 0 < len(done_first) < 60

    again = subprocess.run(argv, env=sq_env, capture_output=True, timeout=120)
    assert again.returncode == 0, again.stderr.decode()
    assert b"60 answers" in again.stdout
    second = lines(log)[len(first) :]
    started_again = {prompt for what, prompt in second if what == "start"}
    assert not started_again & done_first, "a prompt answered before the kill ran again"
    ends = Counter(prompt for what, prompt in lines(log) if what == "end")
    in_flight = {p for what, p in first if what == "start"} - done_first
    for prompt, n in ends.items():
        assert n == 1 or (n == 2 and prompt in in_flight), (prompt, n)
    with Queue("agent-example", create=False) as q:
        assert q.status().counts["done"] == 60
