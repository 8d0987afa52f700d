"""The automatic compaction's child process runs nothing from the working
directory.

It was started as `python -m statequeue...`, which puts the working
directory first on the import path: an `orjson.py` there (or a file named
like a standard module) ran in it, from a library program or `statequeue
run` started in that folder. Found by an outside tester; the keeper and the
guard were already isolated (-I).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

PROGRAM = textwrap.dedent(
    """
    import time
    from statequeue import Queue
    q = Queue("ac", auto_compact=50)
    q.enqueue([str(i) for i in range(400)])
    for item in q.work():
        item.done(int(item.item))
    q.close()
    q = Queue("ac", auto_compact=50)
    print(q.status().counts["done"], q.notices())
    """
)


def test_the_compaction_child_imports_nothing_from_the_working_directory(
    tmp_path: Path, sq_env: dict[str, str]
) -> None:
    hostile = tmp_path / "project"
    hostile.mkdir()
    hit = tmp_path / "TRAP_HIT"
    (hostile / "orjson.py").write_text(
        f"open({str(hit)!r}, 'a').write('imported')\nraise SystemExit(3)\n"
    )
    (tmp_path / "prog.py").write_text(PROGRAM)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "prog.py")],
        cwd=hostile,
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # The program itself imports orjson from its own folder's path first
    # (the script's folder, not the working directory): it is unaffected.
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "400 []", done.stdout
    assert not hit.exists(), "the compaction child ran orjson.py from the working directory"
    journal = Path(sq_env["STATEQUEUE_HOME"]) / "ac" / "journal.jsonl"
    assert journal.stat().st_size < 50_000  # compacted: 400 done items archived
