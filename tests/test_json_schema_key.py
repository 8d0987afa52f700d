"""An outside tester's finding: `enqueue --json`, `run --json` and `compact
--json` had no "schema" key while `retry`, `cancel` and `fsck --json` do
(`import --json` had none either). Every one now carries "schema": 1 and
keeps every key it had. Real CLI."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import STATEQUEUE

Env = dict[str, str]


def sq_json(env: Env, *args: str, stdin: bytes = b"") -> dict[str, Any]:
    done = subprocess.run(
        [STATEQUEUE, *args], input=stdin, env=env, capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    found = json.loads(lines[0])
    assert isinstance(found, dict)
    return found


def test_every_changing_command_json_carries_schema_1(sq_env: Env, tmp_path: Path) -> None:
    listing = tmp_path / "list.txt"
    listing.write_bytes(b"c\nd\n")
    fast = sq_json(sq_env, "enqueue", "--json", "a", "b")  # the fast path (cli/main.py)
    assert fast == {"schema": 1, "added": 2, "skipped": 0}
    # An option only the full CLI parses takes the typer path.
    full = sq_json(sq_env, "enqueue", "--json", "--queue", "default", "-f", str(listing), "--")
    assert full == {"schema": 1, "added": 2, "skipped": 0}

    ran = sq_json(sq_env, "run", "--json", "--", "true")
    assert ran["schema"] == 1
    for key in ("succeeded", "failed", "held", "retry_pending", "verified", "interrupted",
                "attempts", "started", "held_by_dead_runner", "silent_runner_items",
                "cut_short", "output_cut", "exit_code"):  # fmt: skip
        assert key in ran, key
    assert ran["succeeded"] == 4 and ran["exit_code"] == 0

    compacted = sq_json(sq_env, "compact", "--json")
    assert compacted["schema"] == 1
    for key in ("bytes_before", "bytes_after", "archived", "archive_bytes", "rows_moved",
                "logs_removed", "log_bytes_removed"):  # fmt: skip
        assert key in compacted, key
    assert compacted["archived"] == 4

    export = subprocess.run(
        [STATEQUEUE, "export"], env=sq_env, capture_output=True, timeout=60, check=True
    ).stdout
    imported = sq_json(sq_env, "import", "-q", "copy", "--json", stdin=export)
    assert imported == {"schema": 1, "added": 4, "skipped": 0, "paused": False}
