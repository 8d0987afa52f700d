"""The CLI's contract: errors are one line with a documented code, every command
has help with an example, and the operating commands do what they say."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from statequeue.cli.app import app
from tests.conftest import STATEQUEUE

Env = dict[str, str]


def sq(env: Env, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [STATEQUEUE, *args], input=stdin, env=env, capture_output=True, timeout=60, check=False
    )


BIG_ITEM = "x" * 65537

# (arguments, expected exit code). The queue `default` exists with items 1
# (done), 2 (failed) and 3 (pending) when each runs.
BAD_INVOCATIONS: list[tuple[list[str], int]] = [
    (["enqueue", "-q", "../x", "a"], 2),
    (["enqueue", "-q", "a/b", "a"], 2),
    (["enqueue", "-q", ".hidden", "a"], 2),
    (["status", "-q", "nope"], 7),
    (["run", "-q", "nope", "--", "true"], 7),
    (["show", "999"], 7),
    (["show", "abc"], 2),
    (["show", "0"], 2),
    (["run"], 2),
    (["run", "--"], 2),
    (["run", "--timeout", "5x", "--", "true"], 2),
    (["run", "--grace=-1", "--", "true"], 2),
    (["run", "--jobs", "0", "--", "true"], 2),
    (["run", "--on-interrupted", "maybe", "--", "true"], 2),
    (["run", "--verify", "'unterminated", "--", "true"], 2),
    (["run", "--max-time", "soon", "--", "true"], 2),
    (["run", "--retry-delay", "1h2x", "--", "true"], 2),
    (["list", "--state", "bogus"], 2),
    (["results", "--state", "pending"], 2),
    (["results", "--json", "--csv"], 2),
    (["retry"], 2),
    (["retry", "1"], 2),
    (["retry", "999"], 7),
    (["retry", "2", "--failed"], 2),
    (["cancel"], 2),
    (["cancel", "999"], 7),
    (["cancel", "1"], 2),
    (["logs", "999"], 7),
    (["drop", "nope", "--yes"], 7),
    (["drop", "default"], 2),
    (["enqueue", "--file", "/nonexistent/list"], 2),
    (["enqueue", "a", "--file", "list"], 2),
    (["enqueue", BIG_ITEM], 2),
    (["frobnicate"], 2),
    (["enqueue", "--bogus"], 2),
    (["status", "--interval", "0", "--watch"], 2),
    (["--home", "/proc/no-such-dir/home", "enqueue", "x"], 2),
    (["status", "-q", "a\x01b"], 2),
]


@pytest.fixture
def populated(sq_env: Env, sq_home: Path) -> Path:
    sq(sq_env, "enqueue", "one", "two", "three")
    ran = sq(sq_env, "run", "--limit", "2", "--", "sh", "-c", 'test "$0" = one', "{}")
    assert ran.returncode == 1, ran.stderr
    return sq_home / "default" / "journal.jsonl"


def assert_one_line_error(out: subprocess.CompletedProcess[bytes], code: int) -> None:
    err = out.stderr.decode(errors="replace")
    assert out.returncode == code, (out.returncode, err)
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("statequeue: "), err


@pytest.mark.parametrize(("args", "code"), BAD_INVOCATIONS, ids=lambda v: str(v)[:40])
def test_bad_invocation(populated: Path, sq_env: Env, args: list[str], code: int) -> None:
    before = populated.read_bytes()
    out = sq(sq_env, *args)
    assert_one_line_error(out, code)
    assert populated.read_bytes() == before, "a bad invocation changed the queue"


def test_locked_journal_times_out(populated: Path, sq_env: Env) -> None:
    fd = os.open(populated.parent / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        out = sq(dict(sq_env, STATEQUEUE_LOCK_TIMEOUT="0.2"), "status")
        assert_one_line_error(out, 8)
    finally:
        os.close(fd)
    out = sq(dict(sq_env, STATEQUEUE_LOCK_TIMEOUT="soon"), "status")
    assert_one_line_error(out, 2)


def test_damaged_journal_error(populated: Path, sq_env: Env) -> None:
    data = bytearray(populated.read_bytes())
    data[data.index(b'"two"') + 2] ^= 0x01
    populated.write_bytes(bytes(data))
    for args in (["status"], ["enqueue", "x"], ["run", "--", "true"], ["list"]):
        assert_one_line_error(sq(sq_env, *args), 5)
    assert populated.read_bytes() == bytes(data)


def test_invalid_input_bytes_do_not_crash(sq_env: Env) -> None:
    out = sq(sq_env, "enqueue", "-0", stdin=b"\xff\0\xfe\xfd\0")
    assert out.returncode == 0 and b"added 2" in out.stdout


def command_names() -> list[str]:
    return sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_every_command_has_help_with_an_example() -> None:
    names = command_names()
    expected = {"enqueue", "run", "status", "compact", "list", "show", "logs", "results"}
    expected |= {"queues", "path", "retry", "cancel", "pause", "resume", "fsck", "drop"}
    expected |= {"events", "rm"}
    assert expected <= set(names)
    runner = CliRunner()
    for name in names:
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, name
        assert "Example" in result.output, f"`{name} --help` has no example"


def test_top_level_help_and_completion() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "--install-completion" in result.output and "Example" in result.output


def test_fsck_repair_keeps_every_valid_record(populated: Path, sq_env: Env) -> None:
    lines = populated.read_bytes().splitlines(keepends=True)
    middle = len(lines) // 2
    damaged = bytearray(lines[middle])
    damaged[10] ^= 0x04
    populated.write_bytes(b"".join([*lines[:middle], bytes(damaged), *lines[middle + 1 :]]))
    checked = sq(sq_env, "fsck", "--json")
    assert checked.returncode == 5
    report = json.loads(checked.stdout)
    assert report["journal"]["bad_lines"] == [middle + 1]
    repaired = sq(sq_env, "fsck", "--repair", "--json")
    assert repaired.returncode == 0, repaired.stderr
    kept = json.loads(repaired.stdout)["kept_damaged_files"]
    assert Path(kept[0]).read_bytes().splitlines()[middle] == bytes(damaged).rstrip(b"\n")
    salvaged = [json.loads(x) for x in populated.read_bytes().splitlines()]
    originals = [json.loads(x) for i, x in enumerate(lines) if i != middle]
    strip = ("seq", "crc")

    def body(r: dict[str, object]) -> dict[str, object]:
        return {k: v for k, v in r.items() if k not in strip}

    # The snapshot header is rebuilt; every other valid record is kept as it was.
    assert salvaged[0]["t"] == "snap" and salvaged[0]["next_id"] == originals[0]["next_id"]
    assert [body(r) for r in salvaged[1:]] == [body(r) for r in originals[1:]]
    assert sq(sq_env, "status").returncode == 0
    assert sq(sq_env, "fsck").returncode == 0
    assert sq(sq_env, "enqueue", "four").returncode == 0


def test_retry_cancel_and_show(populated: Path, sq_env: Env) -> None:
    failed = json.loads(sq(sq_env, "list", "--state", "failed", "--json").stdout)
    assert failed["item"] == "two" and failed["state"] == "failed"
    assert json.loads(sq(sq_env, "retry", "--failed", "--json").stdout)["changed"] == [2]
    assert json.loads(sq(sq_env, "cancel", "3", "--json").stdout)["changed"] == [3]
    shown = json.loads(sq(sq_env, "show", "2", "--json").stdout)
    assert shown["state"] == "pending"
    assert [e["t"] for e in shown["events"]] == ["enq", "start", "end", "set"]
    ran = sq(sq_env, "run", "--json", "--", "true")
    assert json.loads(ran.stdout)["succeeded"] == 1  # item 2 ran; cancelled 3 did not
    counts = json.loads(sq(sq_env, "status", "--json").stdout)["counts"]
    assert (counts["done"], counts["cancelled"], counts["pending"]) == (2, 1, 0)


def test_results_include_archived_items(populated: Path, sq_env: Env) -> None:
    sq(sq_env, "compact")
    sq(sq_env, "run", "--", "true")
    out = sq(sq_env, "results", "--json")
    rows = [json.loads(x) for x in out.stdout.splitlines()]
    by_item = {r["item"]: r for r in rows}
    assert by_item["one"]["archived"] is True and by_item["one"]["state"] == "done"
    assert by_item["two"]["state"] == "failed" and by_item["three"]["state"] == "done"
    failed = sq(sq_env, "results", "--state", "failed", "--csv").stdout.decode().splitlines()
    assert failed[0].startswith("id,item,state") and len(failed) == 2


def test_queues_path_and_events(populated: Path, sq_env: Env) -> None:
    listing = json.loads(sq(sq_env, "queues", "--json").stdout)
    assert [q["queue"] for q in listing["queues"]] == ["default"]
    assert sq(sq_env, "path").stdout.decode().strip() == str(populated.parent)
    events = [json.loads(x) for x in sq(sq_env, "events", "--json").stdout.splitlines()]
    assert [e["t"] for e in events].count("enq") == 3 and events[0]["schema"] == 1
    assert b"enqueued #1" in sq(sq_env, "events").stdout


def test_drop_takes_the_queue_from_q_as_every_command_does(sq_env: Env) -> None:
    # `help commands` says every command takes -q; drop refused it (exit 2).
    for name in ("a", "b", "c", "d"):
        assert sq(sq_env, "-q", name, "enqueue", "x").returncode == 0
    assert sq(sq_env, "-q", "a", "drop", "--yes").returncode == 0
    assert sq(sq_env, "drop", "-q", "b", "--yes").returncode == 0
    assert sq(sq_env, "rm", "c", "-q", "c", "--yes").returncode == 0  # the same queue twice
    both = sq(sq_env, "drop", "d", "-q", "x", "--yes")
    assert both.returncode == 2 and b"two queues named" in both.stderr
    by_omission = sq(sq_env, "drop", "--yes")  # never the default queue by omission
    assert by_omission.returncode == 2 and b"name the queue to drop" in by_omission.stderr
    listed = sq(sq_env, "queues").stdout.decode()
    assert [line.split()[0] for line in listed.splitlines()] == ["d"]


def test_drop_with_yes(populated: Path, sq_env: Env) -> None:
    assert sq(sq_env, "drop", "default", "--yes").returncode == 0
    assert not populated.parent.exists()


def wait_for(predicate: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def test_pause_stops_a_live_runner_and_resume_restarts_it(sq_env: Env, tmp_path: Path) -> None:
    started = tmp_path / "started"
    gate = tmp_path / "gate"
    sq(sq_env, "enqueue", "1", "2", "3")
    worker = f'echo "$0" >> {started}; while [ ! -e {gate} ]; do sleep 0.01; done'
    runner = subprocess.Popen(
        [STATEQUEUE, "run", "--no-live", "--", "sh", "-c", worker, "{}"],
        env=sq_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: started.exists())
        assert sq(sq_env, "pause").returncode == 0
        gate.touch()  # item 1 may now finish; nothing new may start
        wait_for(lambda: json.loads(sq(sq_env, "status", "--json").stdout)["counts"]["done"] == 1)
        time.sleep(1.0)  # a live runner polls every 0.25 s: give it time to misbehave
        assert started.read_text().split() == ["1"]
        assert runner.poll() is None, "the runner must wait while paused, not exit"
        assert sq(sq_env, "resume").returncode == 0
        assert runner.wait(timeout=30) == 0
        assert started.read_text().split() == ["1", "2", "3"]
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()


def test_a_run_on_a_paused_queue_says_once_that_it_waits_for_resume(
    sq_env: Env, tmp_path: Path
) -> None:
    # A new user saw a run of a paused queue sit silent, as if hung.
    sq(sq_env, "enqueue", "1", "2")
    assert sq(sq_env, "pause").returncode == 0
    err = tmp_path / "err"
    with err.open("wb") as sink:
        runner = subprocess.Popen(
            [STATEQUEUE, "run", "--no-live", "--", "true"],
            env=sq_env,
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    try:
        wait_for(lambda: "paused" in err.read_text())
        time.sleep(0.6)  # two more polls of the pause (every 0.25 s): still said once
        assert runner.poll() is None
        said = [line for line in err.read_text().splitlines() if "paused" in line]
        assert said == [
            "statequeue: queue 'default' is paused: waiting for"
            " `statequeue -q default resume` (Ctrl-C stops the run)"
        ]
        assert sq(sq_env, "resume").returncode == 0
        assert runner.wait(timeout=30) == 0
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()


def test_status_shows_paused_rate_and_failures(populated: Path, sq_env: Env) -> None:
    sq(sq_env, "pause")
    st = json.loads(sq(sq_env, "status", "--json").stdout)
    assert st["paused"] is True and st["recent_failures"][0]["item"] == "two"
    text = sq(sq_env, "status").stdout.decode()
    assert "PAUSED" in text and "two" in text and "exit code 1" in text


def test_python_module_entry_point(sq_env: Env) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "statequeue", "--help"], env=sq_env, capture_output=True, check=False
    )
    assert out.returncode == 0 and b"enqueue" in out.stdout


def test_fast_enqueue_path_matches_the_full_cli(sq_env: Env, tmp_path: Path) -> None:
    listing = tmp_path / "l"
    listing.write_bytes(b"p\0q\0")
    fast = [
        sq(sq_env, "enqueue", "a", "b"),
        sq(sq_env, "enqueue", "--json", "a", "c"),
        sq(sq_env, "-q", "other", "enqueue", "--null", "--file", str(listing), "--json"),
    ]
    assert [o.stdout for o in fast] == [
        b"added 2, skipped 0 already queued\n",
        b'{"schema":1,"added":1,"skipped":1}\n',
        b'{"schema":1,"added":2,"skipped":0}\n',
    ]
    # The same through typer (an option only the full CLI parses forces it).
    via_typer = sq(sq_env, "enqueue", "--json", "--queue", "other", "-f", str(listing), "-0", "--")
    assert via_typer.stdout == b'{"schema":1,"added":0,"skipped":2}\n'
    assert_one_line_error(sq(sq_env, "enqueue", "-q", "a/b", "x"), 2)


def test_fast_status_path_matches_the_full_cli(sq_env: Env) -> None:
    sq(sq_env, "enqueue", "a", "b", "c")
    sq(sq_env, "cancel", "2")
    # --interval is parsed only by the full CLI: the same command through typer.
    for extra in ([], ["--json"]):
        fast = sq(sq_env, "status", *extra)
        via_typer = sq(sq_env, "status", *extra, "--interval", "1")
        assert fast.returncode == via_typer.returncode == 0
        assert fast.stdout == via_typer.stdout
        assert b"cancel" in fast.stdout
    missing = sq(sq_env, "-q", "nosuch", "status", "--json")
    assert_one_line_error(missing, 7)
    assert missing.stderr == sq(sq_env, "-q", "nosuch", "status", "--interval", "1").stderr


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_follow_views_stream_while_a_runner_works(sq_env: Env, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    sq(sq_env, "enqueue", "a")
    worker = f"echo working-on-$0; while [ ! -e {gate} ]; do sleep 0.02; done; echo finished"
    runner = subprocess.Popen(
        [STATEQUEUE, "run", "--no-live", "--", "sh", "-c", worker, "{}"],
        env=sq_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    views = [
        # SIGINT restored: a shell running the suite in the background leaves
        # it ignored, and an ignored SIGINT stays ignored in every child.
        subprocess.Popen(
            [STATEQUEUE, *args], env=sq_env, stdout=subprocess.PIPE, preexec_fn=_default_sigint
        )
        for args in (
            ["logs", "1", "--follow"],
            ["events", "--follow", "--json"],
            ["status", "--watch", "--json", "--interval", "0.2"],
        )
    ]
    try:
        wait_for(lambda: json.loads(sq(sq_env, "status", "--json").stdout)["counts"]["running"])
        gate.touch()
        assert runner.wait(timeout=30) == 0
        logs_out, _ = views[0].communicate(timeout=15)  # ends when the item is done
        assert b"working-on-a" in logs_out and b"finished" in logs_out
        time.sleep(0.6)
        for view in views[1:]:
            view.send_signal(2)
            out, _ = view.communicate(timeout=10)
            assert view.returncode in (0, 130)
            docs = [json.loads(x) for x in out.splitlines()]
            assert docs and all(d["schema"] == 1 for d in docs)
        kinds = {d.get("t") for d in [json.loads(x) for x in out.splitlines()]}
        assert kinds == {None}  # status docs have no record type
    finally:
        for p in [runner, *views]:
            if p.poll() is None:
                p.kill()
                p.wait()
