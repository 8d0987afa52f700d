"""Every example in the README's "Python" section runs as it stands (issue 13 point 7)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def python_examples() -> list[str]:
    text = README.read_text()
    section = text.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_section_has_one_example_per_feature() -> None:
    joined = "\n".join(python_examples())
    for feature in ("queue.result(", "queue.work(retries", "statequeue.map(", "resumable(",
                    "map_async(", "work_async(", 'enqueue("abc")'):  # fmt: skip
        assert feature in joined, feature


@pytest.mark.parametrize("index", range(len(python_examples())))
def test_readme_example_runs(index: int, tmp_path: Path, sq_env: dict[str, str]) -> None:
    script = tmp_path / f"example_{index}.py"
    script.write_text(python_examples()[index])
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=sq_env, capture_output=True, timeout=120
    )
    assert out.returncode == 0, out.stderr.decode()
