"""Issue 26, point 1: `run --quiet` is quiet, so the cron recipe of the
`commands` help page mails only when an item failed for good.

The recipe is taken from the page as written (only /data moves under
tmp_path, and `pdftotext` is a stand-in script on PATH), and run by sh."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import STATEQUEUE

TOPICS = Path(__file__).parent.parent / "statequeue" / "cli" / "topics"


def _cron_recipe() -> str:
    """The command line of the page's cron recipe, as cron would pass it to sh."""
    page = (TOPICS / "commands.md").read_text()
    block = re.search(r"### Cron recipe\n\n```sh\n(.*?)```", page, re.S)
    assert block is not None, "the commands page lost its cron recipe"
    lines = [line for line in block.group(1).splitlines() if not line.startswith("#")]
    entry = " ".join(line.strip() for line in lines)
    entry = entry.replace("\\ ", "")  # cron joins nothing: the page's `\` ends a line
    fields = entry.split(None, 5)
    assert len(fields) == 6, entry
    return fields[5]  # after the five time fields


@pytest.fixture
def cron(tmp_path: Path, sq_env: dict[str, str]) -> tuple[str, dict[str, str], Path]:
    data = tmp_path / "data"
    (data / "in").mkdir(parents=True)
    (data / "txt").mkdir()
    tools = tmp_path / "bin"
    tools.mkdir()
    fake = tools / "pdftotext"
    # Fails for a file named bad.pdf, as a damaged PDF would.
    fake.write_text('#!/bin/sh\ncase "$1" in *bad.pdf) exit 1;; esac\necho text > "$2"\n')
    fake.chmod(0o755)
    env = dict(sq_env, PATH=f"{tools}{os.pathsep}{sq_env['PATH']}")
    assert Path(STATEQUEUE).exists()
    return _cron_recipe().replace("/data/", f"{data}/"), env, data


def _run(cron: tuple[str, dict[str, str], Path]) -> subprocess.CompletedProcess[str]:
    line, env, _ = cron
    return subprocess.run(["sh", "-c", line], env=env, capture_output=True, text=True, timeout=120)


def test_cron_recipe_leaves_stderr_empty_when_all_went_well(
    cron: tuple[str, dict[str, str], Path],
) -> None:
    data = cron[2]
    (data / "in" / "a.pdf").write_text("pdf")
    first = _run(cron)  # a new item: --verify-first says "not done", then it runs
    assert (first.returncode, first.stderr, first.stdout) == (0, "", "")
    assert (data / "txt" / "a.txt").read_text() == "text\n"
    idle = _run(cron)  # nothing to do
    assert (idle.returncode, idle.stderr, idle.stdout) == (0, "", "")
    (data / "in" / "b.pdf").write_text("pdf")
    again = _run(cron)  # one more new item, in a queue that has history
    assert (again.returncode, again.stderr) == (0, "")


def test_cron_recipe_mails_a_failure_with_the_summary(
    cron: tuple[str, dict[str, str], Path],
) -> None:
    data = cron[2]
    (data / "in" / "a.pdf").write_text("pdf")
    (data / "in" / "bad.pdf").write_text("pdf")
    done = _run(cron)  # bad.pdf fails its three attempts (--retries 2) within the run
    lines = done.stderr.splitlines()
    assert done.returncode == 1, done.stderr
    assert [line for line in lines if not line.startswith("[failed]")] == [
        "statequeue: items: 1 ok, 1 failed; 4 attempts started"
    ], lines
    assert any("bad.pdf attempt 3: exit code 1" in line for line in lines), lines
