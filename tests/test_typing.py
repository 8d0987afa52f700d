"""The package ships its type hints, and a user program that uses every
public name passes ``mypy --strict`` (issue 13 point 5)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import statequeue

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = Path(__file__).with_name("typing_example.py")
CACHE = ROOT / ".mypy_cache" / "typing_example"


def test_the_package_is_marked_typed() -> None:
    assert (Path(statequeue.__file__).parent / "py.typed").is_file()
    assert 'statequeue = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()


def test_a_user_program_using_every_public_name_passes_mypy_strict(tmp_path: Path) -> None:
    used = EXAMPLE.read_text()
    missing = [name for name in statequeue.__all__ if name not in used]
    assert not missing, f"the example does not use {missing}"
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    out = subprocess.run(
        # The cache (kept where `make lint` keeps its own) makes repeat runs quick.
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(CACHE), str(EXAMPLE)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout + out.stderr
