"""`statequeue run` end to end: the real CLI in subprocesses, real children.

Every test names one feature of the runner and fails if that feature breaks.
Synchronisation is by polling for files the workers write (with deadlines),
not by fixed sleeps. Workers are small `sh -c` scripts (or workers/dump.py)
that report through files under $SQT_DIR; the hanging ones write their pids
to $SQT_DIR/pids so that teardown can kill whatever a test left behind.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import STATEQUEUE

DUMP = str(Path(__file__).parent / "workers" / "dump.py")

# Shell fragments shared by the workers ($SQT_DIR is the test's work folder).
RECORD_PID = 'echo $$ >> "$SQT_DIR/pids/$STATEQUEUE_ID.$STATEQUEUE_ATTEMPT"\n'
HANG_IF_FLAGGED = 'if [ -e "$SQT_DIR/hang" ]; then exec sleep 30; fi\n'


# -- helpers ---------------------------------------------------------------------


def sq(
    env: dict[str, str], *args: str, stdin: str | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_json(
    env: dict[str, str], *args: str, timeout: float = 30
) -> tuple[int, dict[str, Any], str]:
    """`statequeue run --json ARGS`: (exit code, summary, stderr)."""
    out = sq(env, "run", "--json", *args, timeout=timeout)
    assert out.stdout.strip(), f"no JSON summary (exit {out.returncode}): {out.stderr}"
    return out.returncode, json.loads(out.stdout), out.stderr


def status(env: dict[str, str], *args: str) -> dict[str, Any]:
    out = sq(env, "status", "--json", *args)
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def enqueue(env: dict[str, str], *items: str, queue: str = "default") -> None:
    out = sq(env, "enqueue", "-q", queue, *items)
    assert out.returncode == 0, out.stderr


def journal(home: Path, queue: str = "default") -> list[dict[str, Any]]:
    text = (home / queue / "journal.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def records(home: Path, kind: str, item_id: int, queue: str = "default") -> list[dict[str, Any]]:
    return [r for r in journal(home, queue) if r.get("t") == kind and r.get("id") == item_id]


def lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def wait_for(cond: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie has exited and released its locks)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def pids_in(path: Path) -> list[int]:
    return [int(x) for x in lines(path) if x.strip().isdigit()]


def wait_gone(path: Path) -> None:
    """Wait until every pid listed in ``path`` has exited."""
    pids = pids_in(path)
    assert pids, f"no pid recorded in {path}"
    wait_for(lambda: not any(alive(p) for p in pids), f"pids {pids} to exit")


class Procs:
    """Runners started by a test, and worker pids to kill at teardown."""

    def __init__(self, env: dict[str, str], pid_dir: Path) -> None:
        self.env = env
        self.pid_dir = pid_dir
        self.runners: list[subprocess.Popen[str]] = []

    def start(self, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [STATEQUEUE, *args],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.runners.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.runners:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)
        for path in sorted(self.pid_dir.iterdir()):
            for pid in pids_in(path):
                if alive(pid):
                    # It may end between the look and the kill (a detached leftover
                    # that was finishing): CI saw ProcessLookupError here once.
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)


def finish(proc: subprocess.Popen[str], timeout: float = 15) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def kill9(proc: subprocess.Popen[str]) -> None:
    proc.kill()  # SIGKILL, by pid: the runner gets no chance to record anything
    proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGKILL


# -- how the command is run -----------------------------------------------------


def dump(work: Path, item_id: int, attempt: int = 1) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((work / "dump" / f"{item_id}.{attempt}.json").read_text())
    return result


def test_placeholder_is_replaced_inside_arguments_without_a_shell(
    env: dict[str, str], work: Path
) -> None:
    item = "it's $HOME `id`; *"  # a shell would expand, split or glob this
    enqueue(env, item)
    out = sq(env, "run", "--", sys.executable, DUMP, "pre{}post", "x{}y{}z", "plain")
    assert out.returncode == 0, out.stderr
    assert dump(work, 1)["argv"] == [f"pre{item}post", f"x{item}y{item}z", "plain"]


def test_item_is_appended_without_placeholder_and_env_is_set(
    env: dict[str, str], work: Path, sq_home: Path
) -> None:
    enqueue(env, "one", "two", queue="envq")
    out = sq(env, "run", "-q", "envq", "--", sys.executable, DUMP, "--flag")
    assert out.returncode == 0, out.stderr
    for item_id, item in ((1, "one"), (2, "two")):
        seen = dump(work, item_id)
        assert seen["argv"] == ["--flag", item]
        e = seen["env"]
        assert e["STATEQUEUE_ITEM"] == item
        assert e["STATEQUEUE_ID"] == str(item_id)
        assert e["STATEQUEUE_ATTEMPT"] == "1"
        assert e["STATEQUEUE_QUEUE"] == "envq"
        result = Path(e["STATEQUEUE_RESULT"])
        assert result.is_absolute() and result.parent.is_dir()
        assert sq_home.resolve() in result.resolve().parents
    assert dump(work, 1)["env"]["STATEQUEUE_RESULT"] != dump(work, 2)["env"]["STATEQUEUE_RESULT"]


def test_child_stdin_is_dev_null_unless_stdin_flag(env: dict[str, str], work: Path) -> None:
    enqueue(env, "first item")
    # The runner's own stdin has data: a child that inherited it would see it.
    out = sq(env, "run", "--", sys.executable, DUMP, stdin="runner's stdin\n")
    assert out.returncode == 0, out.stderr
    seen = dump(work, 1)
    assert seen["stdin_is_devnull"] is True and seen["stdin"] == ""

    enqueue(env, "second item")
    out = sq(env, "run", "--stdin", "--", sys.executable, DUMP, stdin="runner's stdin\n")
    assert out.returncode == 0, out.stderr
    seen = dump(work, 2)
    assert seen["stdin"] == "second item\n"
    assert seen["stdin_is_devnull"] is False
    assert seen["argv"] == ["second item"]


def test_exit_codes_ok_failed_nothing_to_do_usage_not_found(env: dict[str, str]) -> None:
    assert sq(env, "run", "-q", "nosuchqueue", "--", "true").returncode == 7
    enqueue(env, "a")
    assert sq(env, "run", "--").returncode == 2  # no command
    code, summary, _ = run_json(env, "--", "true")
    assert code == 0 and summary["exit_code"] == 0 and summary["succeeded"] == 1
    code, summary, _ = run_json(env, "--", "true")
    assert code == 0 and summary["exit_code"] == 0 and summary["started"] == 0
    code, summary, _ = run_json(env, "--exit-empty", "3", "--", "true")
    assert code == 3 and summary["exit_code"] == 3 and summary["started"] == 0
    enqueue(env, "b", "c")
    code, summary, _ = run_json(env, "--", "sh", "-c", '[ "$STATEQUEUE_ITEM" = b ]')
    assert code == 1 and summary["exit_code"] == 1
    assert (summary["succeeded"], summary["failed"]) == (1, 1)
    assert status(env)["counts"]["failed"] == 1


# -- concurrency ----------------------------------------------------------------

BARRIER = """
touch "$SQT_DIR/here.$STATEQUEUE_ITEM"
other=a
if [ "$STATEQUEUE_ITEM" = a ]; then other=b; fi
i=0
while [ ! -e "$SQT_DIR/here.$other" ]; do
  i=$((i + 1))
  if [ "$i" -gt 100 ]; then exit 1; fi
  sleep 0.05
done
"""


def test_jobs_2_runs_two_items_at_once(env: dict[str, str]) -> None:
    # Each item waits (up to 5 s) for the other to have started: only true
    # concurrency lets both succeed.
    enqueue(env, "a", "b")
    code, summary, err = run_json(env, "-j2", "--", "sh", "-c", BARRIER)
    assert code == 0, err
    assert summary["succeeded"] == 2 and summary["failed"] == 0


def test_jobs_2_never_runs_more_than_two(env: dict[str, str], work: Path) -> None:
    script = """
touch "$SQT_DIR/active.$STATEQUEUE_ITEM"
ls "$SQT_DIR" | grep -c '^active\\.' >> "$SQT_DIR/counts"
sleep 0.3
rm "$SQT_DIR/active.$STATEQUEUE_ITEM"
"""
    enqueue(env, *[f"i{n}" for n in range(6)])
    code, summary, err = run_json(env, "-j2", "--", "sh", "-c", script)
    assert code == 0, err
    assert summary["succeeded"] == 6
    counts = [int(c) for c in lines(work / "counts")]
    assert len(counts) == 6
    assert max(counts) == 2, counts


# -- timeouts and retries ---------------------------------------------------------

TIMEOUT_WORKER = (
    RECORD_PID
    + """
case "$STATEQUEUE_ITEM" in
  stubborn) trap '' TERM ;;
  polite) trap 'echo got-TERM >&2; exit 9' TERM ;;
  graceful) trap 'exit 0' TERM ;;
esac
sleep 30 &
echo $! >> "$SQT_DIR/pids/$STATEQUEUE_ID.$STATEQUEUE_ATTEMPT"
wait
"""
)


def test_timeout_terms_then_kills_the_process_group(
    env: dict[str, str], work: Path, sq_home: Path
) -> None:
    enqueue(env, "stubborn", "polite", "graceful")
    t0 = time.monotonic()
    code, summary, err = run_json(
        env,
        *("-j3", "--timeout", "1s", "--grace", "0.5s", "--", "sh", "-c", TIMEOUT_WORKER),
        timeout=15,
    )
    elapsed = time.monotonic() - t0
    assert code == 1, err
    assert elapsed < 10, f"run took {elapsed:.1f}s: the children's sleep 30 was not killed"
    assert summary["failed"] == 3 and summary["succeeded"] == 0

    (stubborn,) = records(sq_home, "end", 1)
    assert stubborn["state"] == "failed" and "timed out" in stubborn["reason"]
    assert stubborn.get("timeout") is True
    assert stubborn.get("sig") == signal.SIGKILL  # ignored TERM, so KILL after --grace

    (polite,) = records(sq_home, "end", 2)
    assert polite["state"] == "failed" and "timed out" in polite["reason"]
    assert "got-TERM" in polite.get("err", "")  # TERM came first
    assert polite.get("exit") == 9

    (graceful,) = records(sq_home, "end", 3)  # exit 0 after a timeout is still a failure
    assert graceful["state"] == "failed" and "timed out" in graceful["reason"]

    reasons = {f["item"]: f["reason"] for f in status(env)["recent_failures"]}
    assert all("timed out" in reasons[i] for i in ("stubborn", "polite", "graceful")), reasons
    # Nothing of the process groups outlives the run (sh and its sleep).
    for item_id in (1, 2, 3):
        wait_gone(work / "pids" / f"{item_id}.1")


def test_retries_run_attempts_in_order_with_growing_backoff(
    env: dict[str, str], work: Path, sq_home: Path
) -> None:
    script = """
echo "$STATEQUEUE_ATTEMPT $(date +%s.%N)" >> "$SQT_DIR/attempts"
[ "$STATEQUEUE_ATTEMPT" -ge 4 ]
"""
    delay = 0.25
    enqueue(env, "flaky")
    code, summary, err = run_json(
        env, "--retries", "3", "--retry-delay", f"{delay}s", "--", "sh", "-c", script
    )
    assert code == 0, err
    assert summary["succeeded"] == 1 and summary["retry_pending"] == 0
    assert summary["attempts"] == 4
    seen = [line.split() for line in lines(work / "attempts")]
    assert [int(a) for a, _ in seen] == [1, 2, 3, 4]

    # The journal's history for the item: starts 1..4, ends pending x3 then done.
    history = [r for r in journal(sq_home) if r.get("id") == 1 and r["t"] in ("start", "end")]
    assert [(r["t"], r["attempt"]) for r in history] == [
        (t, a) for a in (1, 2, 3, 4) for t in ("start", "end")
    ]
    ends = [r for r in history if r["t"] == "end"]
    assert [r["state"] for r in ends] == ["pending", "pending", "pending", "done"]
    retry_at = [r["retry_at"] for r in ends[:3]]
    assert retry_at == sorted(retry_at)

    # Backoff: retry k waits delay * 2^(k-1) * U(0.5, 1) after attempt k ends.
    # Each gap is at least its smallest backoff (exact: scheduling only adds);
    # gap 3 (>= 2*delay) always exceeds gap 1 (<= delay); neighbours may touch
    # at the jitter boundaries, so they are compared with a tolerance.
    times = [float(t) for _, t in seen]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    for k, gap in enumerate(gaps, start=1):
        assert gap >= delay * 2 ** (k - 1) * 0.5 - 0.01, gaps
        assert gap <= delay * 2 ** (k - 1) + 1.5, gaps  # no runaway delay
    assert gaps[2] > gaps[0], gaps
    assert gaps[0] <= gaps[1] + 0.15 and gaps[1] <= gaps[2] + 0.15, gaps


# -- crashes: kill -9 of the runner ------------------------------------------------

VERIFY_WORKER = (
    RECORD_PID
    + """
echo "$STATEQUEUE_ATTEMPT" >> "$SQT_DIR/runs.$STATEQUEUE_ITEM"
if [ "$STATEQUEUE_ITEM" = finished ]; then echo output > "$SQT_DIR/out.$STATEQUEUE_ITEM"; fi
touch "$SQT_DIR/started.$STATEQUEUE_ITEM"
"""
    + HANG_IF_FLAGGED
)


def test_verify_settles_an_interrupted_item_without_rerunning_it(
    env: dict[str, str], work: Path, sq_home: Path, procs: Procs
) -> None:
    # "finished" writes its output, then its runner dies before recording it;
    # "unfinished" has no output: --verify must settle the first, re-run the second.
    enqueue(env, "finished", "unfinished")
    (work / "hang").touch()
    runner = procs.start("run", "-j2", "--", "sh", "-c", VERIFY_WORKER)
    wait_for(
        lambda: (work / "started.finished").exists() and (work / "started.unfinished").exists(),
        "both items to start",
    )
    kill9(runner)
    wait_gone(work / "pids" / "1.1")
    wait_gone(work / "pids" / "2.1")
    (work / "hang").unlink()

    verify = f"test -e {shlex.quote(str(work))}/out.{{}}"
    code, summary, err = run_json(env, "-j2", "--verify", verify, "--", "sh", "-c", VERIFY_WORKER)
    assert code == 0, err
    assert lines(work / "runs.finished") == ["1"], "the verified item ran again"
    assert lines(work / "runs.unfinished") == ["1", "2"], "the unverified item was not re-run"
    assert summary["verified"] == 1 and summary["started"] == 1
    assert status(env)["counts"]["done"] == 2
    last_end = records(sq_home, "end", 1)[-1]
    assert last_end["ok"] is True and last_end["state"] == "done"
    assert "verified" in last_end.get("reason", "")


POISON_WORKER = (
    RECORD_PID
    + """
echo "$STATEQUEUE_ATTEMPT" >> "$SQT_DIR/runs.$STATEQUEUE_ITEM"
if [ "$STATEQUEUE_ITEM" = poison ] && [ -e "$SQT_DIR/hang" ]; then exec sleep 30; fi
"""
)


def test_poison_item_is_held_after_max_crashes(
    env: dict[str, str], work: Path, sq_home: Path, procs: Procs
) -> None:
    enqueue(env, "poison", "fine")
    (work / "hang").touch()
    for crash in (1, 2):
        runner = procs.start("run", "--max-crashes", "2", "--", "sh", "-c", POISON_WORKER)
        wait_for(lambda n=crash: len(lines(work / "runs.poison")) == n, f"poison run {crash}")
        kill9(runner)
        wait_gone(work / "pids" / f"1.{crash}")
    (work / "hang").unlink()  # if it ran again, it would now finish (and be seen)

    code, summary, err = run_json(env, "--max-crashes", "2", "--", "sh", "-c", POISON_WORKER)
    assert code == 1, err  # the run held an item: it needs a look (help exit-codes)
    assert summary["started"] == 1  # only "fine"
    assert (summary["succeeded"], summary["held"]) == (1, 1), summary
    assert lines(work / "runs.poison") == ["1", "2"], "the poison item ran a third time"
    assert lines(work / "runs.fine") == ["1"]

    st = status(env)
    assert st["held"] == [1]
    assert st["counts"]["held"] == 1 and st["counts"]["done"] == 1
    assert st["counts"]["pending"] == 0 and st["counts"]["running"] == 0
    held = [r for r in journal(sq_home) if r.get("id") == 1 and r.get("state") == "held"]
    assert held and "poison" in held[-1].get("reason", "")

    # A later run, even with the default --max-crashes, leaves it alone.
    assert sq(env, "run", "--exit-empty", "3", "--", "sh", "-c", POISON_WORKER).returncode == 3
    assert lines(work / "runs.poison") == ["1", "2"]


GRANDCHILD_WORKER = """
echo "$STATEQUEUE_ATTEMPT $(date +%s.%N)" >> "$SQT_DIR/starts"
if [ "$STATEQUEUE_ATTEMPT" = 1 ]; then
  echo $$ > "$SQT_DIR/pids/leader"
  # setsid: this descendant leaves the item's process group, so the group
  # kill after the runner's death misses it; it still holds the claim lock.
  setsid sh -c 'sleep 3; date +%s.%N > "$SQT_DIR/bg_end"' &
  echo $! > "$SQT_DIR/pids/bg"
  wait
fi
"""

IN_GROUP_WORKER = """
echo $$ > "$SQT_DIR/pids/leader"
(exec sleep 30) &
echo $! > "$SQT_DIR/pids/bg"
wait
"""


def test_children_and_their_group_die_with_a_killed_runner(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    enqueue(env, "a")
    first = procs.start("run", "--", "sh", "-c", IN_GROUP_WORKER)
    wait_for(lambda: pids_in(work / "pids" / "bg"), "the grandchild to start")
    kill9(first)
    wait_gone(work / "pids" / "leader")
    wait_gone(work / "pids" / "bg")  # the reaper killed the whole process group
    assert status(env)["interrupted"] == [1]


def test_kill9_never_starts_a_second_copy_while_a_grandchild_lives(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    enqueue(env, "a")
    first = procs.start("run", "--", "sh", "-c", GRANDCHILD_WORKER)
    wait_for(lambda: pids_in(work / "pids" / "bg"), "the grandchild to start")
    kill9(first)
    wait_gone(work / "pids" / "leader")  # sh died with its runner (the keeper)
    # The grandchild left the group, but not the keeper (its subreaper): it
    # is killed too, instead of running on beside the item's next attempt.
    wait_gone(work / "pids" / "bg")
    assert not (work / "bg_end").exists(), "the grandchild outlived its runner"

    # Once the keeper has released the claim, the item is recovered and runs again.
    second = procs.start("run", "--follow", "--", "sh", "-c", GRANDCHILD_WORKER)
    wait_for(lambda: status(env)["counts"]["done"] == 1, "the item to be done", timeout=15)
    assert len(lines(work / "starts")) == 2
    second.send_signal(signal.SIGTERM)
    code, _, err = finish(second)
    assert code == 0, err  # --follow stopped by TERM with nothing in flight: a clean stop


def test_single_refuses_while_another_runner_is_active(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    script = RECORD_PID + 'touch "$SQT_DIR/started.$STATEQUEUE_ITEM"\n' + HANG_IF_FLAGGED
    enqueue(env, "a", "b")
    (work / "hang").touch()
    first = procs.start("run", "--", "sh", "-c", script)
    wait_for(lambda: (work / "started.a").exists(), "the first runner to start item a")

    quick = 'touch "$SQT_DIR/started.$STATEQUEUE_ITEM"'
    second = sq(env, "run", "--single", "--", "sh", "-c", quick)
    assert second.returncode == 4, second.stderr
    assert "another runner is active" in second.stderr
    assert not (work / "started.b").exists(), "--single started an item anyway"
    assert status(env)["counts"]["pending"] == 1
    # With --quiet (cron): the overlap is what --single is for, not news to mail.
    hushed = sq(env, "run", "--single", "--quiet", "--", "sh", "-c", quick)
    assert (hushed.returncode, hushed.stderr, hushed.stdout) == (4, "", "")
    assert not (work / "started.b").exists()

    # A runner killed with -9 is not active any more.
    kill9(first)
    wait_gone(work / "pids" / "1.1")
    (work / "hang").unlink()
    third = sq(env, "run", "--single", "--", "sh", "-c", script)
    assert third.returncode == 0, third.stderr
    assert status(env)["counts"]["done"] == 2


# -- stopping ------------------------------------------------------------------------

# When hanging, the sleep is a foreground grandchild (pid recorded too): only a
# signal to the whole process group reaches it.
STOPPABLE_WORKER = (
    RECORD_PID
    + """
echo "$STATEQUEUE_ITEM" >> "$SQT_DIR/runs"
if [ -e "$SQT_DIR/hang" ]; then
  sh -c 'echo $$ >> "$1"; exec sleep 30' inner "$SQT_DIR/pids/$STATEQUEUE_ID.$STATEQUEUE_ATTEMPT"
  exit 1
fi
"""
)


@pytest.mark.parametrize(("signum", "expected"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_stops_the_run_and_interrupted_items_run_again(
    env: dict[str, str], work: Path, sq_home: Path, procs: Procs, signum: int, expected: int
) -> None:
    enqueue(env, "a", "b", "c")
    (work / "hang").touch()
    # A long --grace: the run can end quickly only if the signal reached the children.
    runner = procs.start(
        "run", "--json", "-j2", "--grace", "60s", "--", "sh", "-c", STOPPABLE_WORKER
    )
    wait_for(
        lambda: (
            len(pids_in(work / "pids" / "1.1")) == 2 and len(pids_in(work / "pids" / "2.1")) == 2
        ),
        "two items to start",
    )
    t0 = time.monotonic()
    runner.send_signal(signum)
    code, out, err = finish(runner, timeout=20)
    assert code == expected, err
    assert time.monotonic() - t0 < 10, "the signal was not forwarded to the children"
    summary = json.loads(out)
    assert summary["interrupted"] == 2 and summary["exit_code"] == expected
    wait_gone(work / "pids" / "1.1")
    wait_gone(work / "pids" / "2.1")
    assert sorted(lines(work / "runs")) == ["a", "b"], "c should not have been taken"

    st = status(env)
    assert st["counts"]["pending"] == 3 and st["counts"]["running"] == 0
    assert st["counts"]["failed"] == 0
    for item_id in (1, 2):
        (intr,) = records(sq_home, "intr", item_id)
        assert intr["state"] == "pending"

    (work / "hang").unlink()
    again = sq(env, "run", "-j2", "--", "sh", "-c", STOPPABLE_WORKER)
    assert again.returncode == 0, again.stderr
    assert sorted(lines(work / "runs")) == ["a", "a", "b", "b", "c"]
    assert status(env)["counts"]["done"] == 3


# -- how much a run takes ----------------------------------------------------------

LOG_ITEM = 'echo "$STATEQUEUE_ITEM" >> "$SQT_DIR/runs"'


def test_limit_takes_at_most_n_items(env: dict[str, str], work: Path) -> None:
    enqueue(env, *[f"i{n}" for n in range(1, 6)])
    code, summary, err = run_json(env, "--limit", "2", "--", "sh", "-c", LOG_ITEM)
    assert code == 0, err
    assert summary["started"] == 2
    assert lines(work / "runs") == ["i1", "i2"]
    counts = status(env)["counts"]
    assert counts["done"] == 2 and counts["pending"] == 3
    code, _, err = run_json(env, "--limit", "2", "--", "sh", "-c", LOG_ITEM)
    assert code == 0, err
    assert lines(work / "runs") == ["i1", "i2", "i3", "i4"]


def test_max_time_stops_taking_items_and_lets_running_ones_finish(
    env: dict[str, str], work: Path, sq_home: Path
) -> None:
    total = 6
    enqueue(env, *[f"i{n}" for n in range(total)])
    t0 = time.monotonic()
    code, summary, err = run_json(
        env, "--max-time", "1s", "--", "sh", "-c", LOG_ITEM + "\nsleep 0.4"
    )
    elapsed = time.monotonic() - t0
    assert code == 0, err
    ran = len(lines(work / "runs"))
    assert 1 <= ran < total, f"ran {ran} items of {total} in {elapsed:.1f}s"
    assert elapsed < 8
    assert summary["started"] == ran and summary["succeeded"] == ran
    counts = status(env)["counts"]
    assert counts["done"] == ran and counts["pending"] == total - ran
    assert counts["failed"] == 0 and counts["running"] == 0
    assert not [r for r in journal(sq_home) if r.get("t") == "intr"]


def test_follow_picks_up_items_enqueued_later_and_exits_on_sigterm(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    script = 'echo "$STATEQUEUE_ITEM $(date +%s.%N)" >> "$SQT_DIR/runs"'
    enqueue(env, "first")
    runner = procs.start("run", "--follow", "--json", "--", "sh", "-c", script)
    wait_for(lambda: lines(work / "runs"), "the first item to run")
    for n in (1, 2, 3):
        enqueue(env, f"late{n}")
        enqueued = time.time()
        assert runner.poll() is None, "--follow exited when the queue ran dry"
        wait_for(lambda n=n: len(lines(work / "runs")) == n + 1, f"late{n} to run", timeout=5)
        name, started = lines(work / "runs")[n].split()
        assert name == f"late{n}"
        assert float(started) - enqueued < 1.5, "--follow was slow to pick up a new item"
    runner.send_signal(signal.SIGTERM)
    code, out, err = finish(runner)
    assert code == 0, err  # a service's normal stop
    summary = json.loads(out)
    assert summary["started"] == 4 and summary["succeeded"] == 4
    assert status(env)["counts"]["done"] == 4


# -- what is recorded ------------------------------------------------------------------

RESULT_WORKER = """
case "$STATEQUEUE_ITEM" in
  good)
    echo to-stdout
    echo warn-1 >&2
    echo warn-2 >&2
    printf '{"item": "%s", "n": 42, "list": [1, 2]}' "$STATEQUEUE_ITEM" > "$STATEQUEUE_RESULT"
    ;;
  bad)
    echo boom-on-stderr >&2
    exit 3
    ;;
  noisy)
    head -c 20000 /dev/zero | tr '\\0' x >&2
    echo THE-END >&2
    ;;
esac
"""


def test_stderr_tail_json_result_and_log_are_stored(env: dict[str, str], sq_home: Path) -> None:
    enqueue(env, "good", "bad", "noisy")
    code, summary, err = run_json(env, "--", "sh", "-c", RESULT_WORKER)
    assert code == 1, err
    assert (summary["succeeded"], summary["failed"]) == (2, 1)

    (good,) = records(sq_home, "end", 1)
    assert good["state"] == "done" and good["exit"] == 0
    assert good["err"] == "warn-1\nwarn-2\n"
    assert good["result"] == {"item": "good", "n": 42, "list": [1, 2]}
    assert "to-stdout" in (sq_home / "default" / "logs" / "1.1.log").read_text()

    (bad,) = records(sq_home, "end", 2)
    assert bad["state"] == "failed" and bad["exit"] == 3
    assert "boom-on-stderr" in bad["err"]
    assert "3" in bad["reason"]
    (failure,) = status(env)["recent_failures"]
    assert failure["id"] == 2 and failure["item"] == "bad" and failure["attempts"] == 1

    (noisy,) = records(sq_home, "end", 3)
    assert noisy["err"].endswith("THE-END\n"), "the tail, not the head, is kept"
    assert 1000 < len(noisy["err"]) < 20000, "a bounded tail is kept"
    assert noisy.get("result") is None


def test_warns_when_the_command_differs_from_the_last_run(env: dict[str, str]) -> None:
    warning = "last run with a different command"
    enqueue(env, "a")
    first = sq(env, "run", "--", "true")
    assert first.returncode == 0 and warning not in first.stderr
    enqueue(env, "b")
    changed = sq(env, "run", "--", "sh", "-c", "exit 0")
    assert changed.returncode == 0
    assert warning in changed.stderr
    enqueue(env, "c")
    same = sq(env, "run", "--", "sh", "-c", "exit 0")
    assert same.returncode == 0 and warning not in same.stderr


# -- regressions: no second copy while an earlier attempt's process lives ------------

STRAY_WORKER = (
    RECORD_PID
    + """
echo "$STATEQUEUE_ATTEMPT" >> "$SQT_DIR/starts"
if [ "$STATEQUEUE_ATTEMPT" = 1 ]; then
  (trap '' TERM; touch "$SQT_DIR/ready"; exec sleep 20) &
  echo $! >> "$SQT_DIR/pids/$STATEQUEUE_ID.$STATEQUEUE_ATTEMPT"
  wait
fi
"""
)


def test_timeout_kills_group_members_that_outlive_the_leader(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    enqueue(env, "a")
    code, _, err = run_json(
        env, "--timeout", "1s", "--grace", "0.3s", "--", "sh", "-c", STRAY_WORKER
    )
    assert code == 1, err
    pids = pids_in(work / "pids" / "1.1")
    wait_for(lambda: not any(alive(p) for p in pids), "the process group to die", timeout=2)


def test_no_second_copy_while_a_stopped_items_descendant_lives(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    enqueue(env, "a")
    runner = procs.start("run", "--grace", "0.3s", "--", "sh", "-c", STRAY_WORKER)
    wait_for(lambda: (work / "ready").exists(), "the item's TERM-proof descendant to start")
    runner.send_signal(signal.SIGTERM)
    code, _, err = finish(runner)
    assert code == 143, err
    first_copy_alive = any(alive(p) for p in pids_in(work / "pids" / "1.1"))
    again = sq(env, "run", "--", "sh", "-c", STRAY_WORKER)
    assert again.returncode in (0, 3), again.stderr
    two_copies = first_copy_alive and len(lines(work / "starts")) == 2
    assert not two_copies, "attempt 2 started while attempt 1's process still ran"


ESCAPING_WORKER = """
echo "$STATEQUEUE_ATTEMPT $(date +%s.%N)" >> "$SQT_DIR/starts"
if [ "$STATEQUEUE_ATTEMPT" = 1 ]; then
  # Leaves the process group (setsid), so no group kill reaches it; it still
  # holds the claim lock it inherited.
  setsid sh -c 'sleep 1.5; echo "end $(date +%s.%N)" >> "$SQT_DIR/starts"' &
  exit 1
fi
"""


def test_retry_waits_while_an_escaped_descendant_holds_the_claim(
    env: dict[str, str], work: Path
) -> None:
    enqueue(env, "a")
    code, _, err = run_json(
        env, "--retries", "1", "--retry-delay", "0", "--", "sh", "-c", ESCAPING_WORKER
    )
    assert code in (0, 3), err
    # The runner may end before the descendant does (the item stays pending);
    # a later run then takes it, and never while the first copy lives.
    wait_for(lambda: "end" in (work / "starts").read_text(), "the escaped descendant to end")
    again = sq(env, "run", "--", "sh", "-c", ESCAPING_WORKER)
    assert again.returncode in (0, 3), again.stderr
    events = [line.split() for line in lines(work / "starts")]
    end_at = next(float(t) for tag, t in events if tag == "end")
    second = [float(t) for tag, t in events if tag == "2"]
    assert len(second) == 1 and second[0] > end_at, events


HANG_WORKER = RECORD_PID + 'echo "$STATEQUEUE_ATTEMPT" >> "$SQT_DIR/runs"\n' + HANG_IF_FLAGGED


def test_a_signal_stops_a_running_verify_hook(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    enqueue(env, "a")
    (work / "hang").touch()
    first = procs.start("run", "--", "sh", "-c", HANG_WORKER)
    wait_for(lambda: pids_in(work / "pids" / "1.1"), "the item to start")
    kill9(first)
    wait_gone(work / "pids" / "1.1")
    (work / "hang").unlink()
    hook = f"sh -c 'touch {work}/verifying; exec sleep 30'"
    runner = procs.start("run", "--verify", hook, "--", "sh", "-c", HANG_WORKER)
    wait_for(lambda: (work / "verifying").exists(), "the verify hook to start")
    began = time.monotonic()
    runner.send_signal(signal.SIGTERM)
    code, _, err = finish(runner)
    assert code == 143, err
    assert time.monotonic() - began < 5, "the runner waited for its verify hook"
    assert status(env)["counts"]["pending"] == 1  # neither verified nor run


LIMIT_WORKER = 'echo "$0" >> "$SQT_DIR/runs"; test "$0" != a'


def test_limit_counts_items_and_settles_their_retries(env: dict[str, str], work: Path) -> None:
    enqueue(env, "a", "b", "c")
    code, summary, err = run_json(
        env,
        "--limit",
        "2",
        "--retries",
        "2",
        "--retry-delay",
        "0",
        "--",
        "sh",
        "-c",
        LIMIT_WORKER,
        "{}",
    )
    assert code == 1, err
    assert sorted(lines(work / "runs")) == ["a", "a", "a", "b"]  # a: 3 attempts; c: none
    assert summary["failed"] == 1 and summary["succeeded"] == 1
    assert status(env)["counts"]["pending"] == 1  # c was never taken


def test_an_item_stopped_by_a_signal_is_not_settled_by_verify(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    enqueue(env, "a")
    (work / "hang").touch()
    runner = procs.start("run", "--grace", "0.2s", "--", "sh", "-c", HANG_WORKER)
    wait_for(lambda: pids_in(work / "pids" / "1.1"), "the item to start")
    runner.send_signal(signal.SIGTERM)
    assert finish(runner)[0] == 143
    (work / "hang").unlink()
    code, summary, err = run_json(env, "--verify", "true", "--", "sh", "-c", HANG_WORKER)
    assert code == 0, err
    assert summary["verified"] == 0 and summary["started"] == 1
    assert lines(work / "runs") == ["1", "2"]


INT_PROOF_WORKER = (
    RECORD_PID + "trap '' INT TERM\nsleep 30 &\necho $! >> \"$SQT_DIR/pids/sleep\"\nwait\n"
)


def test_second_interrupt_kills_children_at_once(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    enqueue(env, "a")
    runner = procs.start("run", "--grace", "60s", "--", "sh", "-c", INT_PROOF_WORKER)
    wait_for(lambda: pids_in(work / "pids" / "sleep"), "the item to start")
    runner.send_signal(signal.SIGINT)
    time.sleep(0.3)  # the first Ctrl-C is forwarded and ignored by the child
    assert runner.poll() is None, "the first interrupt must wait for --grace"
    began = time.monotonic()
    runner.send_signal(signal.SIGINT)
    code, _, err = finish(runner)
    assert code == 130, err
    assert time.monotonic() - began < 5
    assert status(env)["counts"]["pending"] == 1  # interrupted: runs again next time


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to count fds")
def test_the_runner_holds_no_more_fds_after_many_items(env: dict[str, str], sq_home: Path) -> None:
    # Each child logs how many fds the runner (its parent's parent: the
    # keeper's parent) and the keeper hold while it runs; neither count may
    # grow from item to item (a leak of two pipe ends per item once ended
    # long runs with EMFILE).
    enqueue(env, *(f"i{n}" for n in range(1, 31)))
    script = (
        "read -r _ _ _ r _ < /proc/$PPID/stat; "
        "echo $(ls /proc/$r/fd | wc -l) $(ls /proc/$PPID/fd | wc -l)"
    )
    out = sq(env, "run", "--", "sh", "-c", script)
    assert out.returncode == 0, out.stderr
    logs = sq_home / "default" / "logs"
    counts = [[int(c) for c in (logs / f"{n}.1.log").read_text().split()] for n in range(1, 31)]
    # What is open at the child's look varies by a few with timing (the next
    # child's pipes are made after this one starts): a leak grows by item.
    for column in (0, 1):
        first, last = (max(c[column] for c in part) for part in (counts[:10], counts[-10:]))
        assert last <= first, counts
