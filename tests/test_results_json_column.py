"""`results` (text) prints each result as the compact JSON `show` prints:
valid JSON in its column, not escaped a second time.

Its last column went through the escaping meant for items (tabs, newlines,
backslashes in a TSV column), so `{"msg": "say \\"hi\\""}` came out as
`{"msg":"say \\\\"hi\\\\""}`, which jq could not read, unlike `show`'s line.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import STATEQUEUE

RESULT = {"msg": 'say "hi"', "path": "C:\\tmp", "lines": "a\nb\tc", "uni": "é✓"}


def test_the_results_column_is_the_stored_json(tmp_path: Path, sq_env: dict[str, str]) -> None:
    worker = tmp_path / "w.py"
    worker.write_text(
        "import json, os\n"
        f"open(os.environ['STATEQUEUE_RESULT'], 'w').write(json.dumps({RESULT!r}))\n"
    )
    env = sq_env

    def sq(*args: str) -> str:
        done = subprocess.run(
            [STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    sq("enqueue", "q")
    sq("run", "--no-live", "--", "python3", str(worker), "{}")
    (line,) = sq("results").splitlines()
    column = line.split("\t")[3]
    assert json.loads(column) == RESULT
    shown = [r for r in sq("show", "1").splitlines() if r.startswith("result: ")]
    assert shown == [f"result: {column}"]  # as `show` prints it
