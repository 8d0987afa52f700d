"""Issue 26, "what it must show": `run --help` reads at 80 columns.

The options were in one rich table whose columns left 17 characters for the
descriptions; the help ran to 199 lines. Grouped in panels with short texts,
every description has room (the reference is `statequeue help commands`)."""

from __future__ import annotations

import re
import subprocess

from tests.conftest import STATEQUEUE

NARROWEST = 30  # characters a description line gets, at least
MOST_LINES = 110


def test_run_help_is_readable_at_80_columns(sq_env: dict[str, str]) -> None:
    env = dict(sq_env, COLUMNS="80", TERM="dumb")
    out = subprocess.run(
        [STATEQUEUE, "run", "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) <= MOST_LINES, len(lines)
    assert max(len(line) for line in lines) <= 80
    # A description's continuation line: the panel's edge, blanks, then text.
    starts = [m.end() for line in lines if (m := re.match(r"│ {20,}(?=\S)", line))]
    assert starts, out.stdout
    assert 80 - 2 - max(starts) >= NARROWEST, out.stdout
