"""The import-layer contract (scripts/check_layers.py) holds, and it catches a wrong-way import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check_layers.py"
PACKAGE = ROOT / "statequeue"


def _check(package: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(package)], capture_output=True, text=True, check=False
    )


def test_the_package_keeps_its_layers() -> None:
    done = _check(PACKAGE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_wrong_way_import_fails_naming_it(tmp_path: Path) -> None:
    copy = tmp_path / "statequeue"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    durations = copy / "core" / "durations.py"
    text = durations.read_text()
    durations.write_text(text + "\nfrom statequeue.cli.render import plural  # noqa: E402\n")
    line = text.count("\n") + 2
    done = _check(copy)
    assert done.returncode == 1
    wanted = (
        f"statequeue/core/durations.py:{line}: statequeue.core.durations imports "
        "statequeue.cli.render "
        "(core may not import cli: core <- stats <- store <- api <- run <- cli)"
    )
    assert wanted in done.stdout.splitlines(), done.stdout


def test_a_new_cycle_and_a_private_name_fail(tmp_path: Path) -> None:
    copy = tmp_path / "statequeue"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "core" / "ping.py").write_text("from statequeue.core import pong\n")
    (copy / "core" / "pong.py").write_text("from statequeue.core.ping import _secret\n")
    done = _check(copy)
    assert done.returncode == 1
    assert any(
        "runtime import cycle at import time" in line and "statequeue.core.ping" in line
        for line in done.stdout.splitlines()
    ), done.stdout
    assert any("private name _secret" in line for line in done.stdout.splitlines()), done.stdout


def test_a_local_import_without_a_reason_fails(tmp_path: Path) -> None:
    copy = tmp_path / "statequeue"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "core" / "late.py").write_text(
        "def why() -> None:\n    import json\n\n\ndef because() -> None:\n"
        "    import csv  # lazy: start-up time\n"
    )
    done = _check(copy)
    assert done.returncode == 1
    flagged = [line for line in done.stdout.splitlines() if "no `# lazy: ...` reason" in line]
    assert flagged == [
        "statequeue/core/late.py:2: a function-local import with no `# lazy: ...` reason"
        " (say why it is not at the top, or move it there)"
    ], done.stdout
