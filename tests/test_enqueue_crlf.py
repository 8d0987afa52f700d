"""`enqueue` of a list with CRLF line ends (saved on Windows): the CR before
each LF, and at the end of a last line without one, is no part of the item.
It was kept, so `run -- cat {}` got a file name ending in a carriage return.
NUL-separated input (-0) is still taken byte for byte."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from statequeue import Queue
from statequeue.cli import input as cli_input
from tests.conftest import STATEQUEUE

Env = dict[str, str]


def sq(env: Env, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [STATEQUEUE, *args], input=stdin, env=env, capture_output=True, timeout=120, check=False
    )


def _items(home: Path, queue: str) -> list[bytes]:
    with Queue(queue, home=home, create=False) as q:
        return [v.item.encode("utf-8", "surrogateescape") for v in q.store.items()]


@pytest.mark.parametrize("last_lf", [True, False])
@pytest.mark.parametrize("how", ["stdin", "file"])
def test_crlf_lines_enqueue_without_their_cr(
    sq_env: Env, sq_home: Path, tmp_path: Path, how: str, last_lf: bool
) -> None:
    for name in ("a.txt", "b c.txt"):
        (tmp_path / name).write_text(name)
    data = f"{tmp_path}/a.txt\r\n\r\n{tmp_path}/b c.txt\r\n".encode()
    if not last_lf:
        data = data[:-1]  # the last line ends in a CR alone
    if how == "file":
        (tmp_path / "list.txt").write_bytes(data)
        added = sq(sq_env, "enqueue", "-q", "w", "--file", str(tmp_path / "list.txt"))
    else:
        added = sq(sq_env, "enqueue", "-q", "w", stdin=data)
    assert added.returncode == 0, added.stderr
    assert _items(sq_home, "w") == [f"{tmp_path}/a.txt".encode(), f"{tmp_path}/b c.txt".encode()]
    ran = sq(sq_env, "run", "-q", "w", "--", "cat", "{}")
    assert ran.returncode == 0, ran.stderr  # cat found both files
    assert sq(sq_env, "logs", "-q", "w", "--all").stdout == b"a.txt\nb c.txt\n"


def test_only_the_cr_right_before_the_lf_is_dropped(sq_env: Env, sq_home: Path) -> None:
    data = b"a\rb\r\n\rc\r\n\r\r\nd\r"
    assert sq(sq_env, "enqueue", "-q", "w", stdin=data).returncode == 0
    assert _items(sq_home, "w") == [b"a\rb", b"\rc", b"\r", b"d"]


def test_nul_separated_items_keep_their_cr(sq_env: Env, sq_home: Path) -> None:
    data = b"a\r\n\0b\r\0c\r"
    assert sq(sq_env, "enqueue", "-q", "w", "-0", stdin=data).returncode == 0
    assert _items(sq_home, "w") == [b"a\r\n", b"b\r", b"c\r"]


@pytest.mark.parametrize("chunk", [1, 2, 3, 1 << 22])
def test_crlf_blank_lines_are_counted_never_kept(
    monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """A CRLF blank line is a blank line: skipped, one count per run (never
    held), and the items' line numbers stay right, however the chunks fall."""
    monkeypatch.setattr(cli_input, "_CHUNK", chunk)
    blanks = 20 if chunk < 4 else 3_000_000
    data = b"\r\n" * blanks + b"a\r\n" + b"\r\n" * blanks + b"b\r\n"
    fake = type("Stdin", (), {"buffer": io.BytesIO(data), "isatty": lambda self: False})()
    monkeypatch.setattr(sys, "stdin", fake)
    items, where = cli_input.read_input([], file=None, null=False)
    assert items == ["a", "b"]
    assert len(where.gaps) == 2
    assert [where.name(0), where.name(1)] == [f"line {blanks + 1}", f"line {2 * blanks + 2}"]
