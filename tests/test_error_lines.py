"""An error line shows a name's odd bytes as `list` shows them.

A byte that is not UTF-8 (held as a surrogate escape) came out as \\udcff, and a
control character (an escape sequence in a file name) reached the terminal
raw. Now both show as \\xNN, in the one line every error gets."""

from __future__ import annotations

import subprocess

from tests.conftest import STATEQUEUE

Env = dict[str, str]


def test_odd_bytes_in_an_error_show_escaped(sq_env: Env) -> None:
    enq = subprocess.run([STATEQUEUE, "enqueue", "-q", "z", "a"], env=sq_env, check=False)
    assert enq.returncode == 0
    program = b"no\xffcmd\x1b[31m"
    done = subprocess.run(
        [STATEQUEUE.encode(), b"run", b"-q", b"z", b"--", program],
        env=sq_env,
        capture_output=True,
        check=False,
    )
    assert done.returncode != 0
    assert done.stderr == (
        b"statequeue: command not found in PATH: no\\xffcmd\\x1b[31m; nothing was run\n"
    )
