"""The real `statequeue` in subprocesses: the core promises end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import STATEQUEUE


def sq(
    env: dict[str, str], *args: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [STATEQUEUE, *args], input=stdin, env=env, capture_output=True, timeout=120, check=False
    )


def status(env: dict[str, str], *args: str) -> dict[str, object]:
    out = sq(env, "status", "--json", *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_thousand_items_end_to_end(sq_env: dict[str, str]) -> None:
    items = "".join(f"{i}\n" for i in range(1, 1001)).encode()
    added = sq(sq_env, "enqueue", "--json", stdin=items)
    assert json.loads(added.stdout) == {"schema": 1, "added": 1000, "skipped": 0}
    ran = sq(sq_env, "run", "--", "true")
    assert ran.returncode == 0, ran.stderr[-2000:]
    st = status(sq_env)
    assert st["counts"] == {
        "pending": 0,
        "running": 0,
        "done": 1000,
        "failed": 0,
        "cancelled": 0,
        "held": 0,
    }
    assert st["schema"] == 1 and st["queue"] == "default"
    again = sq(sq_env, "enqueue", "--json", stdin=items)
    assert json.loads(again.stdout) == {"schema": 1, "added": 0, "skipped": 1000}
    assert sq(sq_env, "run", "--exit-empty", "3", "--", "true").returncode == 3  # nothing to do


def test_dedupe_survives_compaction_for_cron_reenqueue(sq_env: dict[str, str]) -> None:
    sq(sq_env, "enqueue", "a", "b")
    sq(sq_env, "run", "--", "true")
    compacted = sq(sq_env, "compact")
    assert compacted.returncode == 0 and b"->" in compacted.stdout
    out = sq(sq_env, "enqueue", "--json", "a", "b", "c")
    assert json.loads(out.stdout) == {"schema": 1, "added": 1, "skipped": 2}


def test_two_runners_run_each_item_exactly_once(sq_env: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "runs.log"
    n = 200
    sq(sq_env, "enqueue", *[str(i) for i in range(n)])
    worker = ["sh", "-c", f'echo "$0" >> {log}', "{}"]
    procs = [
        subprocess.Popen(
            [STATEQUEUE, "run", "--no-live", "--", *worker],
            env=sq_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    codes = [p.wait(timeout=120) for p in procs]
    assert all(c in (0, 3) for c in codes), codes
    runs = log.read_text().split()
    assert sorted(runs, key=int) == [str(i) for i in range(n)]
    assert status(sq_env)["counts"]["done"] == n  # type: ignore[index]


def test_invalid_utf8_on_stdin_is_kept_losslessly(sq_env: dict[str, str], tmp_path: Path) -> None:
    out = sq(sq_env, "enqueue", "--json", stdin=b"ok\n\xff\xfe bad\n\n")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"schema": 1, "added": 2, "skipped": 0}
    seen = tmp_path / "seen"
    script = f"import sys,os; open({str(seen)!r},'ab').write(os.fsencode(sys.argv[1])+b'|')"
    ran = sq(sq_env, "run", "--", sys.executable, "-c", script, "{}")
    assert ran.returncode == 0, ran.stderr
    assert sorted(seen.read_bytes().split(b"|")[:-1]) == [b"ok", b"\xff\xfe bad"]


def test_nul_separated_input_and_file(sq_env: dict[str, str], tmp_path: Path) -> None:
    out = sq(sq_env, "enqueue", "-0", "--json", stdin=b"a b\0c\nd\0")
    assert json.loads(out.stdout) == {"schema": 1, "added": 2, "skipped": 0}
    listing = tmp_path / "items.txt"
    listing.write_text("x\ny\n\nx\n")
    out = sq(sq_env, "enqueue", "--json", "--file", str(listing))
    assert json.loads(out.stdout) == {"schema": 1, "added": 2, "skipped": 1}


def test_queue_and_home_options_everywhere(sq_env: dict[str, str], tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    assert sq(sq_env, "enqueue", "--home", str(other), "-q", "jobs", "x").returncode == 0
    assert (other / "jobs" / "journal.jsonl").exists()
    assert status(sq_env, "--home", str(other), "-q", "jobs")["queue"] == "jobs"
    assert sq(sq_env, "--home", str(other), "-q", "jobs", "status").returncode == 0
    env = dict(sq_env, STATEQUEUE_QUEUE="jobs", STATEQUEUE_HOME=str(other))
    assert status(env)["counts"]["pending"] == 1  # type: ignore[index]


def test_bad_queue_names_are_refused(sq_env: dict[str, str], sq_home: Path) -> None:
    for name in ("../x", "a/b", ".hidden", "", "x\x01"):
        out = sq(sq_env, "enqueue", "-q", name, "item")
        assert out.returncode == 2, (name, out)
        assert out.stderr.count(b"\n") == 1 and b"Traceback" not in out.stderr
    assert not (sq_home.parent / "x").exists()


def test_missing_queue_and_corrupt_journal_exit_codes(
    sq_env: dict[str, str], sq_home: Path
) -> None:
    assert sq(sq_env, "status", "-q", "nope").returncode == 7
    sq(sq_env, "enqueue", "a", "b", "c")
    path = sq_home / "default" / "journal.jsonl"
    data = bytearray(path.read_bytes())
    data[data.index(b'"a"') + 1] = ord("z")  # damage the second record
    path.write_bytes(bytes(data))
    out = sq(sq_env, "status")
    assert out.returncode == 5
    assert str(path).encode() in out.stderr and b"line 2" in out.stderr
    assert path.read_bytes() == bytes(data)


def test_torn_tail_is_reported_and_repaired(sq_env: dict[str, str], sq_home: Path) -> None:
    sq(sq_env, "enqueue", "a", "b")
    path = sq_home / "default" / "journal.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"t":"enq","id":3,"ite')
    out = sq(sq_env, "status", "--json")
    assert out.returncode == 0 and b"torn tail" in out.stderr
    assert json.loads(out.stdout)["counts"]["pending"] == 2
    assert sq(sq_env, "status").stderr == b""


def test_python_dash_m(sq_env: dict[str, str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "statequeue", "enqueue", "--json", "z"],
        env=sq_env,
        capture_output=True,
        check=False,
    )
    assert json.loads(out.stdout) == {"schema": 1, "added": 1, "skipped": 0}


def test_auto_compaction_keeps_the_journal_short(sq_env: dict[str, str], sq_home: Path) -> None:
    env = dict(sq_env, STATEQUEUE_AUTO_COMPACT="40")
    sq(env, "enqueue", *[str(i) for i in range(150)])
    assert sq(env, "run", "--", "true").returncode == 0
    folder = sq_home / "default"
    lines = (folder / "journal.jsonl").read_bytes().count(b"\n")
    assert lines < 150 and (folder / "archive.jsonl").exists()
    assert status(env)["counts"]["done"] == 150
    assert len(sq(env, "results", "--json").stdout.splitlines()) == 150
    assert json.loads(sq(env, "enqueue", "--json", "5", "new").stdout)["added"] == 1
    off = dict(sq_env, STATEQUEUE_AUTO_COMPACT="off")
    sq(off, "enqueue", "-q", "keep", *[str(i) for i in range(60)])
    assert sq(env, "run", "-q", "keep", "--no-auto-compact", "--", "true").returncode == 0
    assert not (sq_home / "keep" / "archive.jsonl").exists()
