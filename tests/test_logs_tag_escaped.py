"""`logs --all --tag` escapes the item in each line's tag (found by an outside
tester): the item went out raw, so an ESC sequence in it reached the
terminal and a tab in it made two tag columns, against the rule that human
output escapes items (`list`, `show`: core/textsafe.py). Now it is escaped
as they escape it, and never cut (the tag tells the items apart)."""

from __future__ import annotations

import subprocess

from statequeue import Queue
from tests.conftest import STATEQUEUE

ITEMS = ["plain", "tab\there", "esc\x1b[2Jclear", "bad\udcffbyte", "back\\slash", "x" * 300]


def test_the_tag_is_the_item_escaped_whole(sq_env: dict[str, str]) -> None:
    with Queue() as q:
        q.enqueue(ITEMS)
    ran = subprocess.run(
        [STATEQUEUE, "run", "--", "sh", "-c", 'echo "one"; echo "two"'],
        env=sq_env,
        capture_output=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    tagged = subprocess.run(
        [STATEQUEUE, "logs", "--all", "--tag"], env=sq_env, capture_output=True, timeout=120
    )
    assert tagged.returncode == 0, tagged.stderr
    tags = [
        "plain",
        "tab\\there",
        "esc\\x1b[2Jclear",
        "bad\\xffbyte",
        "back\\\\slash",
        "x" * 300,
    ]
    expected = [f"{tag}\t{line}".encode() for tag in tags for line in ("one", "two")]
    assert tagged.stdout.splitlines() == expected
    assert b"\x1b" not in tagged.stdout


def test_lines_end_at_newlines_only_as_for_parallel_tag(sq_env: dict[str, str]) -> None:
    """A progress bar redraws with \\r within its line: splitlines() gave each
    redraw a tag of its own; a last line without \\n keeps its tag."""
    with Queue() as q:
        q.enqueue(["a"])
    script = r"printf '10%%\r50%%\r100%%\ndone'"
    ran = subprocess.run(
        [STATEQUEUE, "run", "--", "sh", "-c", script], env=sq_env, capture_output=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    tagged = subprocess.run(
        [STATEQUEUE, "logs", "--all", "--tag"], env=sq_env, capture_output=True, timeout=120
    )
    assert tagged.stdout == b"a\t10%\r50%\r100%\na\tdone\n", tagged.stdout
