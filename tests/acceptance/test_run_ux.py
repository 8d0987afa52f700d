"""What a user meets in `statequeue run` (issue 11, and issue 10 points 9 and
11): the real CLI in subprocesses, real children, signals sent by pid."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
from pathlib import Path

from statequeue import Queue
from tests.acceptance.test_runner import (
    Procs,
    finish,
    journal,
    kill9,
    lines,
    pids_in,
    records,
    run_json,
    sq,
    wait_for,
    wait_gone,
)
from tests.conftest import STATEQUEUE

RECORD_PID = 'echo $$ >> "$SQT_DIR/pids/$STATEQUEUE_ID.$STATEQUEUE_ATTEMPT"\n'
COUNT_RUN = 'echo "$STATEQUEUE_ATTEMPT" >> "$SQT_DIR/runs.$STATEQUEUE_ID"\n'
HANG_IF_FLAGGED = 'if [ -e "$SQT_DIR/hang" ]; then exec sleep 30; fi\n'


# Set-up and checks go through the library in this process (a CLI start costs
# ~0.3 s on a loaded machine); what is under test runs as the real CLI.


def enqueue(env: dict[str, str], *items: str) -> None:
    with Queue("default", home=env["STATEQUEUE_HOME"]) as q:
        q.enqueue(items)


def counts(env: dict[str, str]) -> dict[str, int]:
    with Queue("default", home=env["STATEQUEUE_HOME"], create=False) as q:
        return q.status().counts


def user_retry(env: dict[str, str]) -> None:
    with Queue("default", home=env["STATEQUEUE_HOME"], create=False) as q:
        q.store.retry(None)


# -- 2: --retries counts failures in this episode -----------------------------------

FAIL_UNLESS_FLAG = COUNT_RUN + '[ -e "$SQT_DIR/ok" ]\n'


def test_retries_count_from_a_users_retry(env: dict[str, str], work: Path) -> None:
    enqueue(env, "a")
    code, summary, _ = run_json(
        env, "--retries", "1", "--retry-delay", "0", "--", "sh", "-c", FAIL_UNLESS_FLAG
    )
    assert code == 1 and lines(work / "runs.1") == ["1", "2"]
    user_retry(env)
    code, summary, _ = run_json(
        env, "--retries", "2", "--retry-delay", "0", "--", "sh", "-c", FAIL_UNLESS_FLAG
    )
    assert code == 1 and summary["attempts"] == 3, "--retries 2 after `retry` made too few attempts"
    assert lines(work / "runs.1") == ["1", "2", "3", "4", "5"]


def test_a_stopped_attempt_does_not_use_up_the_retries(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    enqueue(env, "a")
    (work / "hang").touch()
    worker = RECORD_PID + COUNT_RUN + HANG_IF_FLAGGED + "exit 1\n"
    runner = procs.start(
        "run", "--retries", "1", "--retry-delay", "0", "--grace", "5s", "--", "sh", "-c", worker
    )
    wait_for(lambda: pids_in(work / "pids" / "1.1"), "the item to start")
    runner.send_signal(signal.SIGTERM)
    assert finish(runner)[0] == 143
    (work / "hang").unlink()
    code, summary, _ = run_json(
        env, "--retries", "1", "--retry-delay", "0", "--", "sh", "-c", worker
    )
    assert code == 1 and summary["attempts"] == 2, "the stopped attempt used up a retry"


def test_show_makes_episodes_visible(env: dict[str, str]) -> None:
    enqueue(env, "a")
    assert sq(env, "run", "--", "false").returncode == 1
    user_retry(env)
    assert sq(env, "run", "--", "false").returncode == 1
    out = sq(env, "show", "1")
    assert " episode 1:" in out.stdout and " episode 2:" in out.stdout, out.stdout
    events = json.loads(sq(env, "show", "1", "--json").stdout)["events"]
    assert [e["episode"] for e in events if e["t"] == "end"] == [1, 2]


# -- 3: --quiet --------------------------------------------------------------------


def test_quiet_prints_only_failures_and_the_summary(env: dict[str, str]) -> None:
    enqueue(env, "good", "bad", "flaky")
    script = '[ "$1" = good ] || { [ "$1" = flaky ] && [ "$STATEQUEUE_ATTEMPT" -ge 2 ]; }'
    out = sq(
        env,
        "run",
        "--quiet",
        "--retries",
        "1",
        "--retry-delay",
        "0",
        "--",
        "sh",
        "-c",
        script,
        "sh",
        "{}",
    )
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "[failed] #2 bad attempt 2: exit code 1",
        "statequeue: items: 2 ok, 1 failed; 5 attempts started",
    ]


# -- 4: nothing to do --------------------------------------------------------------


def test_nothing_to_do_exits_0_or_the_code_asked_for(env: dict[str, str]) -> None:
    enqueue(env)  # the queue exists, with nothing in it
    out = sq(env, "run", "--", "true")
    assert out.returncode == 0, out.stderr
    assert "nothing to do" in out.stderr
    assert sq(env, "run", "--exit-empty", "3", "--", "true").returncode == 3


# -- 5: a missing command -----------------------------------------------------------


def test_a_missing_command_fails_fast_naming_it(env: dict[str, str], sq_home: Path) -> None:
    enqueue(env, "a", "b")
    out = sq(env, "run", "--", "/nonexistent/cmd", "{}")
    assert out.returncode == 2
    assert out.stderr == "statequeue: command not found: /nonexistent/cmd; nothing was run\n"
    out = sq(env, "run", "--", "no-such-command-here", "{}")
    assert out.returncode == 2 and "no-such-command-here" in out.stderr
    assert not [r for r in journal(sq_home) if r.get("t") in ("start", "end")]
    assert counts(env)["pending"] == 2


def test_a_start_failure_specific_to_an_item_is_recorded_for_it(
    env: dict[str, str], work: Path, sq_home: Path
) -> None:
    (work / "tool").write_text("#!/bin/sh\n")
    (work / "tool").chmod(0o755)
    enqueue(env, str(work / "tool"), str(work / "missing"))
    out = sq(env, "run", "--", "{}")
    assert out.returncode == 1
    (end,) = records(sq_home, "end", 2)
    assert end["state"] == "failed" and not records(sq_home, "end", 1)[0].get("reason")
    assert end["reason"] == f"cannot start command '{work / 'missing'}': No such file or directory"


# -- 6 and issue 10 point 11: the reader of our output goes away --------------------


def test_run_goes_on_when_the_reader_of_stderr_goes_away(env: dict[str, str]) -> None:
    enqueue(env, *[f"i{n}" for n in range(20)])
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    proc = subprocess.run(
        [STATEQUEUE, "run", "--", "sh", "-c", "echo noisy >&2"],
        env=env,
        stderr=write,
        stdout=subprocess.PIPE,
        check=False,
    )
    os.close(write)
    assert proc.returncode == 0, "a lost stderr reader was reported as a failure"
    assert counts(env)["done"] == 20


def _run_on_full_disk(
    env: dict[str, str], stream: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """`statequeue run ARGS` with ``stream`` ("stdout" or "stderr") on /dev/full
    (every write fails with ENOSPC), the other captured."""
    with open("/dev/full", "w") as full:
        other = "stdout" if stream == "stderr" else "stderr"
        streams = {stream: full, other: subprocess.PIPE}
        return subprocess.run(
            [STATEQUEUE, "run", *args], env=env, text=True, check=False, **streams
        )


def test_run_goes_on_when_stderr_is_on_a_full_disk(env: dict[str, str]) -> None:
    """`2>>job.log` on a full disk: a write of progress fails (ENOSPC, here
    /dev/full). The run once stopped after its first item and exited 1; the
    JSON summary (on stdout) was never written."""
    enqueue(env, *[f"i{n}" for n in range(8)])
    proc = _run_on_full_disk(env, "stderr", "--json", "--", "sh", "-c", "echo noisy >&2")
    assert proc.returncode == 0, "a full disk under stderr was reported as a failure"
    assert counts(env)["done"] == 8
    assert json.loads(proc.stdout)["succeeded"] == 8


def test_run_live_goes_on_when_stdout_is_on_a_full_disk(env: dict[str, str]) -> None:
    enqueue(env, *[f"i{n}" for n in range(6)])
    proc = _run_on_full_disk(env, "stdout", "--live", "--", "sh", "-c", "echo out; echo err >&2")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert counts(env)["done"] == 6


def test_run_live_piped_to_head_exits_quietly(env: dict[str, str]) -> None:
    enqueue(env, *[f"i{n}" for n in range(10)])
    shell = f"{STATEQUEUE} run --live -- sh -c 'seq 1 20000' | head -n 1"
    out = subprocess.run(shell, shell=True, env=env, capture_output=True, text=True, check=False)
    assert out.stdout == "1\n"
    assert "Traceback" not in out.stderr and "Broken pipe" not in out.stderr, out.stderr
    assert counts(env)["done"] == 10


# -- 7: --follow stopped by SIGTERM ----------------------------------------------------


def test_follow_stopped_by_sigterm_exits_0(env: dict[str, str], work: Path, procs: Procs) -> None:
    enqueue(env, "a")
    runner = procs.start("run", "--follow", "--", "sh", "-c", COUNT_RUN)
    wait_for(lambda: counts(env)["done"] == 1, "the item to finish")
    runner.send_signal(signal.SIGTERM)
    code, _, err = finish(runner)
    assert code == 0, err


def test_follow_stopped_while_an_item_runs_hands_it_back_and_exits_0(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    enqueue(env, "a")
    (work / "hang").touch()
    runner = procs.start("run", "--follow", "--", "sh", "-c", RECORD_PID + HANG_IF_FLAGGED)
    wait_for(lambda: pids_in(work / "pids" / "1.1"), "the item to start")
    runner.send_signal(signal.SIGTERM)
    code, _, err = finish(runner)
    assert code == 0, err
    assert counts(env)["pending"] == 1


# -- 9: the summary counts items ----------------------------------------------------


def test_summary_counts_items_not_events(env: dict[str, str]) -> None:
    enqueue(env, "a", "b")
    script = '[ "$STATEQUEUE_ATTEMPT" -ge 3 ]'
    out = sq(env, "run", "--retries", "3", "--retry-delay", "0", "--", "sh", "-c", script)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines()[-1] == "statequeue: items: 2 ok, 0 failed; 6 attempts started"


def test_summary_is_printed_on_a_terminal_with_jobs(env: dict[str, str]) -> None:
    enqueue(env, "a", "b", "c")
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [STATEQUEUE, "run", "-j2", "--", "true"],
        env={**env, "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=follower,
    )
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the terminal's other side is closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(timeout=30) == 0
    assert b"items: 3 ok, 0 failed; 3 attempts started" in seen, seen


# -- 10: a timeout says what happened -------------------------------------------------


def test_timeout_reason_says_what_happened(env: dict[str, str], sq_home: Path) -> None:
    enqueue(env, "stubborn")
    script = "trap '' TERM; sleep 5 & wait; sleep 5"
    out = sq(env, "run", "--timeout", "300ms", "--grace", "200ms", "--", "sh", "-c", script)
    assert out.returncode == 1
    (end,) = records(sq_home, "end", 1)
    assert end["reason"] == "timed out after 300ms; killed (SIGKILL) after 200ms grace"


# -- 11: recovery is reported; lines carry attempts and the whole item ----------------


def test_a_rerun_says_what_it_recovered(env: dict[str, str], work: Path, procs: Procs) -> None:
    enqueue(env, "a", "b")
    (work / "hang").touch()
    runner = procs.start("run", "-j2", "--", "sh", "-c", RECORD_PID + HANG_IF_FLAGGED)
    wait_for(
        lambda: pids_in(work / "pids" / "1.1") and pids_in(work / "pids" / "2.1"), "both items"
    )
    kill9(runner)
    wait_gone(work / "pids" / "1.1")
    wait_gone(work / "pids" / "2.1")
    (work / "hang").unlink()
    out = sq(env, "run", "--", "sh", "-c", RECORD_PID + HANG_IF_FLAGGED)
    assert out.returncode == 0, out.stderr
    assert (
        out.stderr.splitlines()[0] == "statequeue: recovered 2 interrupted items (1, 2): retrying"
    )
    assert "[ok] #1 a (" in out.stderr and ", attempt 2)" in out.stderr


def test_progress_lines_never_cut_the_item(env: dict[str, str]) -> None:
    item = "long/" + "x" * 150 + "/end"
    enqueue(env, item)
    out = sq(env, "run", "--", "false")
    assert f"[failed] #1 {item} attempt 1: exit code 1" in out.stderr.splitlines()


# -- 12: --verify ---------------------------------------------------------------------


def crash_after_work(env: dict[str, str], work: Path, procs: Procs, *items: str) -> None:
    """Run the items so that each one writes out/ITEM, then kill -9 the runner
    before it can record them: they are left interrupted."""
    (work / "out").mkdir(exist_ok=True)
    worker = RECORD_PID + COUNT_RUN + 'touch "$SQT_DIR/out/$1"\nexec sleep 30\n'
    runner = procs.start("run", f"-j{len(items)}", "--", "sh", "-c", worker, "sh", "{}")
    for n in range(1, len(items) + 1):
        wait_for(lambda n=n: pids_in(work / "pids" / f"{n}.1"), f"item {n} to start")
    wait_for(lambda: len(list((work / "out").iterdir())) == len(items), "the work to be done")
    kill9(runner)
    for n in range(1, len(items) + 1):
        wait_gone(work / "pids" / f"{n}.1")


def test_a_broken_verify_stops_the_run_with_exit_2(
    env: dict[str, str], work: Path, procs: Procs, sq_home: Path
) -> None:
    enqueue(env, "a")
    crash_after_work(env, work, procs, "a")
    # Its first word is fine (a missing first command is refused before the run,
    # tests/test_verify_broken.py); the one it reaches is not.
    check = "test -n {} && no-such-checker {}"
    out = sq(env, "run", "--verify", check, "--", "sh", "-c", COUNT_RUN)
    assert out.returncode == 2, out.stderr
    assert "--verify script failed with exit 127 (not found)" in out.stderr
    assert "no-such-checker" in out.stderr  # sh's own message, shown
    assert lines(work / "runs.1") == ["1"], "the item ran though its check was broken"
    # The item is still one whose runner died: a working check settles it.
    code, summary, err = run_json(env, "--verify", f"test -e {work}/out/{{}}", "--", "false")
    assert code == 0 and summary["verified"] == 1, err


def test_the_first_failing_verify_shows_its_stderr(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    enqueue(env, "a", "b")
    crash_after_work(env, work, procs, "a", "b")
    check = 'echo "checked $1" >&2; exit 1'
    out = sq(env, "run", "--verify", check, "--", "true")
    assert out.returncode == 0, out.stderr
    said = [line for line in out.stderr.splitlines() if "--verify said not done" in line]
    assert said == ["statequeue: item 1: --verify said not done (exit 1): checked a"]


def test_verify_first_skips_what_is_already_done(
    env: dict[str, str], work: Path, sq_home: Path
) -> None:
    (work / "out").mkdir()
    (work / "out" / "b c.txt").write_text("done")
    enqueue(env, "in/a.src", "in/b c.src")
    check = f'test -s "{work}/out/$(basename {{}} .src).txt"'
    worker = f'touch "{work}/out/$(basename "$1" .src).txt"; echo "$1" >> "{work}/ran"'
    out = sq(env, "run", "--verify-first", "--verify", check, "--", "sh", "-c", worker, "sh", "{}")
    assert out.returncode == 0, out.stderr
    assert lines(work / "ran") == ["in/a.src"]
    (end,) = records(sq_home, "end", 2)
    assert end["reason"] == "verified before run" and end["state"] == "done"
    assert "[verified] #2 in/b c.src: done before its first run; not run" in out.stderr


def test_verify_never_pastes_the_item_into_shell_text(env: dict[str, str], work: Path) -> None:
    item = "x'; touch pwned; echo '$(touch pwned2)\\$HOME"
    enqueue(env, item)
    code, summary, err = run_json(
        env,
        "--verify-first",
        "--verify",
        f'cd {work} && test "$STATEQUEUE_ITEM" = {{}}',
        "--",
        "false",
    )
    assert code == 0 and summary["verified"] == 1, err
    assert not (work / "pwned").exists() and not (work / "pwned2").exists()


# -- 23: replacement strings reach the child as bytes ---------------------------------


def test_replacement_strings_reach_the_child_byte_for_byte(env: dict[str, str], work: Path) -> None:
    item = b"dir/od\xffd.tar.gz"
    enqueue(env, os.fsdecode(item))
    dump = (
        "import os, sys; open(os.environ['SQT_DIR'] + '/argv', 'wb')"
        ".write(b'\\0'.join(map(os.fsencode, sys.argv[1:])))"
    )
    out = sq(
        env,
        "run",
        "--",
        sys.executable,
        "-c",
        dump,
        "{}",
        "{.}",
        "{/}",
        "{//}",
        "{/.}",
        "{#}",
        "{%}",
        "o/{/.}.txt",
    )
    assert out.returncode == 0, out.stderr
    assert (work / "argv").read_bytes().split(b"\0") == [
        item,
        b"dir/od\xffd.tar",
        b"od\xffd.tar.gz",
        b"dir",
        b"od\xffd.tar",
        b"1",
        b"1",
        b"o/od\xffd.tar.txt",
    ]


def test_job_slots_stay_within_jobs(env: dict[str, str], work: Path) -> None:
    enqueue(env, *[f"i{n}" for n in range(8)])
    out = sq(env, "run", "-j3", "--", "sh", "-c", 'echo "$1" >> "$SQT_DIR/slots"', "sh", "{%}")
    assert out.returncode == 0, out.stderr
    assert set(lines(work / "slots")) <= {"1", "2", "3"} and len(lines(work / "slots")) == 8


# -- issue 10 point 9: a result nested too deeply --------------------------------------


def test_a_deeply_nested_result_is_stored_as_an_error(env: dict[str, str], sq_home: Path) -> None:
    enqueue(env, "deep", "sibling")
    script = """
if [ "$1" = deep ]; then
  python3 -c 'print("[" * 300 + "]" * 300)' > "$STATEQUEUE_RESULT"
  exit 0
fi
sleep 0.2
"""
    out = sq(env, "run", "-j2", "--", "sh", "-c", script, "sh", "{}")
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert "item 1: result JSON cannot be stored" in out.stderr
    assert counts(env)["done"] == 2
    (end,) = records(sq_home, "end", 1)
    assert end["ok"] is True and "cannot be stored" in end["result"]["error"]
