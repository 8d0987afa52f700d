"""Issue 21's smaller points: an empty STATEQUEUE_HOME is refused as `--home ''`
is; blank lines skipped by `enqueue` are never held; and the notice for a torn
tail past the last checkpoint says what is and is not known."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from statequeue.cli import input as cli_input
from statequeue.core.errors import UsageError
from tests.conftest import STATEQUEUE

Env = dict[str, str]
USAGE = 2


def sq(env: Env, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [STATEQUEUE, *args], input=stdin, env=env, capture_output=True, timeout=300, check=False
    )


# -- an empty home ---------------------------------------------------------------


def test_an_empty_statequeue_home_is_refused_like_an_empty_home_option(
    sq_env: Env, tmp_path: Path
) -> None:
    by_option = sq(sq_env, "--home", "", "enqueue", "a")
    by_env = sq({**sq_env, "STATEQUEUE_HOME": "", "HOME": str(tmp_path)}, "enqueue", "a")
    assert by_option.returncode == by_env.returncode == USAGE
    assert by_env.stderr == by_option.stderr
    assert by_env.stderr.count(b"\n") == 1 and b"invalid home folder" in by_env.stderr
    assert not any(tmp_path.rglob("journal.jsonl"))  # not the default home either


# -- blank lines -------------------------------------------------------------------


def _naive(data: bytes, sep: bytes) -> tuple[list[str], list[int]]:
    """Items and their 1-based line numbers, the obvious way."""
    parts = data.split(sep)
    if parts and parts[-1] == b"":
        parts.pop()
    found = [(os.fsdecode(p), n) for n, p in enumerate(parts, 1) if p]
    return [t for t, _ in found], [n for _, n in found]


@pytest.mark.parametrize("sep", [b"\n", b"\0"])
@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1 << 22])
def test_items_and_their_lines_are_found_across_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sep: bytes, chunk: int
) -> None:
    monkeypatch.setattr(cli_input, "_CHUNK", chunk)
    data = sep.join([b"", b"", b"a", b"", b"caf\xe9", "né".encode(), b"", b"", b"", b"b", b"c"])
    for tail in (b"", sep, sep * 3):
        path = tmp_path / "items"
        path.write_bytes(data + tail)
        items, where = cli_input.read_input([], file=str(path), null=sep == b"\0")
        texts, lines = _naive(data + tail, sep)
        assert items == texts
        kind = "item" if sep == b"\0" else "line"
        assert [where.name(i) for i in range(len(items))] == [
            f"{kind} {n} in {path}" if kind == "item" else f"{path}: line {n}" for n in lines
        ]


def test_an_empty_argument_is_refused_by_its_position() -> None:
    """Once skipped in silence (`enqueue "$UNSET"` added nothing, exit 0)."""
    with pytest.raises(UsageError, match=r"^argument 3: empty item"):
        cli_input.read_input(["a", "b", "", "c", ""], file=None, null=False)
    items, where = cli_input.read_input(["a", "b"], file=None, null=False)
    assert items == ["a", "b"]
    assert [where.name(0), where.name(1)] == ["argument 1", "argument 2"]


def test_blank_lines_are_never_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """However many blank lines come, what is kept of them is one count per run."""
    data = b"\n" * 3_000_000 + b"a\n" + b"\n" * 1_000_000 + b"b\n"
    fake = type("Stdin", (), {"buffer": io.BytesIO(data), "isatty": lambda self: False})()
    monkeypatch.setattr(sys, "stdin", fake)
    items, where = cli_input.read_input([], file=None, null=False)
    assert items == ["a", "b"]
    assert len(where.gaps) == 2  # two runs, not four million positions
    assert [where.name(0), where.name(1)] == ["line 3000001", "line 4000002"]


_MAXRSS = """
import resource, subprocess, sys, tempfile
with tempfile.TemporaryFile() as f:  # this process never holds the input (a fork copies it)
    for _ in range(int(sys.argv[1]) // 1000):
        f.write(b"\\n" * 1000)
    f.write(b"item\\n")
    f.seek(0)
    subprocess.run(sys.argv[2:], stdin=f, capture_output=True, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def _enqueue_maxrss(env: Env, blank_lines: int, queue: str) -> int:
    """Peak resident KiB of one `statequeue enqueue` given that many blank lines."""
    argv = [sys.executable, "-c", _MAXRSS, str(blank_lines), STATEQUEUE, "enqueue", "-q", queue]
    out = subprocess.run(argv, env=env, capture_output=True, check=True, timeout=300)
    return int(out.stdout)


def test_enqueue_of_millions_of_blank_lines_keeps_memory_flat(sq_env: Env) -> None:
    baseline = _enqueue_maxrss(sq_env, 1000, "few")
    many = _enqueue_maxrss(sq_env, 4_000_000, "many")
    # Before: ~44 bytes per blank line (a list slot and an int each), 4e6 of
    # them ~180 MB over a ~50 MB process. Now one 4 MB chunk at a time.
    assert many < baseline * 1.5, (many, baseline)
    assert sq(sq_env, "list", "-q", "many").stdout.count(b"\n") == 1


# -- a torn tail past the last checkpoint ------------------------------------------


def test_a_cut_past_the_last_checkpoint_claims_nothing_it_cannot_know(
    sq_env: Env, sq_home: Path
) -> None:
    assert sq(sq_env, "enqueue", "-q", "q", "a", "b", "c").returncode == 0
    assert sq(sq_env, "enqueue", "-q", "q", "d", "e", "f").returncode == 0
    journal = sq_home / "q" / "journal.jsonl"
    data = journal.read_bytes()
    journal.write_bytes(data[: len(data) - 40])  # into the last record, past any checkpoint
    said = []
    for args in (("fsck", "--repair"), ("list",), ("fsck",)):
        done = sq(sq_env, *args, "-q", "q")
        assert done.returncode == 0, done.stderr
        said.append((done.stdout + done.stderr).decode())
    text = "".join(said)
    assert "torn tail" in said[0] and "repaired a torn tail" in said[1], said
    assert "no acknowledged record was lost" not in text
    assert "cannot be known past the last checkpoint" in said[0]
    assert "cannot be known past the last checkpoint" in said[1]


@pytest.mark.parametrize(
    ("queue", "args"),
    [
        ("default", ["enqueue"]),
        ("default", ["enqueue", "--file", "-"]),
        ("new", ["enqueue", "--json"]),
    ],
    ids=["fast-path", "full-cli", "named-queue-json"],
)
def test_bad_items_leave_no_new_queue_behind(sq_env: Env, queue: str, args: list[str]) -> None:
    # Promise 6: bad input changes nothing. A NUL item was refused (exit 2)
    # only after the queue it named had been created, empty.
    home = Path(sq_env["STATEQUEUE_HOME"])
    done = sq(sq_env, "-q", queue, *args, stdin=b"good\nba\0d\n")
    assert done.returncode == USAGE, done.stderr
    assert b"line 2" in done.stderr and b"NUL" in done.stderr
    assert not (home / queue).exists(), "a new queue was left behind"
    # An existing queue takes good items as before, and bad input changes nothing there.
    assert sq(sq_env, "-q", queue, *args, stdin=b"good\n").returncode == 0
    assert sq(sq_env, "-q", queue, *args, stdin=b"other\nba\0d\n").returncode == USAGE
    listed = sq(sq_env, "-q", queue, "list")
    assert listed.stdout.split() == [b"1", b"pending", b"0", b"good"], listed.stdout


# -- an attacker's inputs: one line and a documented code, never a traceback ------


def _one_line(done: subprocess.CompletedProcess[bytes]) -> str:
    err = done.stderr.decode(errors="replace")
    assert b"Traceback" not in done.stderr and len(err.splitlines()) == 1, err
    return err


def test_a_host_name_that_is_not_utf8_is_refused_and_nothing_is_claimed(sq_env: Env) -> None:
    assert sq(sq_env, "enqueue", "a").returncode == 0
    env = {**sq_env, "STATEQUEUE_HOST": os.fsdecode(b"h\xff")}
    done = sq(env, "run", "--", "true")
    assert done.returncode == USAGE
    assert "STATEQUEUE_HOST must be UTF-8 text" in _one_line(done)
    assert sq(sq_env, "list").stdout.split()[:3] == [b"1", b"pending", b"0"]


def test_a_store_url_that_is_not_utf8_is_refused(sq_env: Env) -> None:
    done = sq(sq_env, "--store", os.fsdecode(b"postgresql://u@h/\xff"), "status")
    assert done.returncode == USAGE
    assert "invalid store URL: it is not UTF-8 text" in _one_line(done)


def test_a_watch_interval_past_a_day_is_refused(sq_env: Env) -> None:
    assert sq(sq_env, "enqueue", "a").returncode == 0
    done = sq(sq_env, "status", "--watch", "--interval", "1e10")  # overflowed time_t
    assert done.returncode == USAGE
    assert "--interval must be a finite number of seconds up to 86400" in _one_line(done)


def test_an_error_never_names_a_file_descriptor_as_the_file(sq_env: Env, sq_home: Path) -> None:
    assert sq(sq_env, "enqueue", "a").returncode == 0
    journal = sq_home / "default" / "journal.jsonl"
    journal.unlink()
    journal.mkdir()
    done = sq(sq_env, "fsck")
    # Refused as anything but a regular file of this user's is (fileio.open_own),
    # named by its path (it was "error: 5: Is a ...", then "error: Is a directory").
    assert done.returncode == 9
    said = f"statequeue: {journal} is a folder, not a regular file; statequeue refuses to use it"
    assert _one_line(done) == said + " (remove it)\n"


@pytest.mark.parametrize(
    "args",
    [
        ["cancel", "1"],
        ["list"],
        ["pause"],
        ["status"],
        ["enqueue", "x"],
        ["cancel", "1", "--store", ""],
    ],
    ids=lambda a: a[0] + ("-after" if a[-1] == "" else ""),
)
def test_an_empty_store_is_refused_by_every_command(
    sq_home: Path, sq_env: dict[str, str], args: list[str]
) -> None:
    """`--store ''` (an unset variable, most often) was refused by status and
    enqueue, while cancel, list, pause and others quietly used the local
    journal (or $STATEQUEUE_STORE): cancel changed a queue it was not aimed at."""
    from statequeue import ItemState, Queue

    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
    front = [] if args[-1] == "" else ["--store", ""]
    done = subprocess.run(
        [STATEQUEUE, *front, *args], env=sq_env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    with Queue(home=sq_home) as q:
        assert [v.state for v in q.items()] == [ItemState.PENDING]


def test_a_byte_order_mark_is_no_part_of_the_first_item(tmp_path: Path) -> None:
    """A list saved by a Windows editor (BOM, CRLF): the BOM once became part
    of item 1, which then failed, invisibly, and enqueued again was a new item."""
    listing = tmp_path / "list.txt"
    listing.write_bytes(b"\xef\xbb\xbfa.pdf\r\nb.pdf\r\n")
    items, _ = cli_input.read_input([], file=str(listing), null=False)
    assert items == ["a.pdf", "b.pdf"]
    listing.write_bytes(b"\xef\xbb\xbf")
    assert cli_input.read_input([], file=str(listing), null=False)[0] == []
    listing.write_bytes(b"a\xef\xbb\xbf\n")  # elsewhere it is the item's own bytes
    assert cli_input.read_input([], file=str(listing), null=False)[0] == ["a\ufeff"]
