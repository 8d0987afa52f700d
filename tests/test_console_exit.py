"""Issue 27, start-up: the console command's process ends without the
interpreter's teardown (cli/process.py ``exit_without_teardown``), but still
waits for its other non-daemon threads, runs atexit handlers and keeps its
exit code and its output. The time saved is measured by scripts/bench_start.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import STATEQUEUE

Env = dict[str, str]

SCRIPT = """
import atexit, sys, threading, time
import click
from statequeue.cli import process, root

started = threading.Event()

def late_writer():
    started.wait()
    time.sleep(0.2)  # the scenario, not a wait: without the join, the exit comes first
    print("thread finished", flush=True)

threading.Thread(target=late_writer).start()
atexit.register(lambda: sys.stdout.write("atexit ran\\n"))  # buffered: the exit flushes it

@click.command()
def cmd():
    sys.stdout.write("command ran\\n")  # buffered: the exit must flush it
    started.set()
    return 3

process.OWNS_PROCESS = True
root.run_and_exit(lambda: cmd, [])
"""


def test_the_exit_waits_for_threads_and_runs_atexit(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.stderr == ""
    assert done.stdout.splitlines() == ["command ran", "thread finished", "atexit ran"]
    assert done.returncode == 3


def test_a_console_command_keeps_its_output_and_code(sq_env: Env) -> None:
    def sq(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [STATEQUEUE, "-q", "q", *args]
        return subprocess.run(argv, env=sq_env, capture_output=True, text=True, check=False)

    assert sq("enqueue", "a", "b").returncode == 0
    ran = sq("run", "--no-live", "--json", "--", "sh", "-c", 'test "$0" = a')
    assert ran.returncode == 1  # item b failed
    assert '"succeeded":1,"failed":1' in ran.stdout
    listed = sq("list", "--state", "failed")
    assert (listed.returncode, listed.stdout.split()[-1]) == (0, "b")
    gone = sq("show", "99")
    assert gone.returncode == 7 and gone.stderr.startswith("statequeue:")
