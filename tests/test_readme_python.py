"""Every Python example in the README and in the `statequeue help` pages runs as it stands
(issue 13 point 7, issue 22 item 7): alone, in any order, and twice over in one home."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TOPICS = ROOT / "statequeue" / "cli" / "topics"
QUEUE_NAME = re.compile(r"""(?:Queue\(|queue=)"([^"]+)\"""")


def documents() -> list[Path]:
    return [README, *sorted(TOPICS.glob("*.md"))]


def python_examples() -> list[tuple[str, str]]:
    """(where, code) for every ```python block of every document."""
    found = []
    for doc in documents():
        blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
        found += [(f"{doc.name}#{n}", code) for n, code in enumerate(blocks)]
    return found


EXAMPLES = python_examples()


def run_example(code: str, folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    script = folder / "example.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(script)], cwd=folder, env=env, capture_output=True, timeout=120
    )


def test_the_python_page_has_one_example_per_feature() -> None:
    joined = "\n".join(code for where, code in EXAMPLES if where.startswith("python.md"))
    for feature in ("queue.result(", "queue.work(retries", "statequeue.map(", "resumable(",
                    "map_async(", "work_async(", 'enqueue("abc")'):  # fmt: skip
        assert feature in joined, feature


def test_the_readme_has_a_taste_of_the_library() -> None:
    assert any(where.startswith("README.md") for where, _ in EXAMPLES)


def test_each_example_uses_queues_of_its_own() -> None:
    names = Counter(name for _, code in EXAMPLES for name in set(QUEUE_NAME.findall(code)))
    shared = sorted(name for name, count in names.items() if count > 1)
    assert not shared, f"queue names used by more than one example: {shared}"
    for where, code in EXAMPLES:
        # A worker for `run` (statequeue.serve) opens no queue: the runner hands it its items.
        uses_a_queue = "statequeue.serve(" not in code
        assert QUEUE_NAME.search(code) or not uses_a_queue, f"{where} names no queue of its own"


@pytest.mark.parametrize("where", [where for where, _ in EXAMPLES])
def test_example_runs(where: str, tmp_path: Path, sq_env: dict[str, str]) -> None:
    code = dict(EXAMPLES)[where]
    out = run_example(code, tmp_path, sq_env)
    assert out.returncode == 0, out.stderr.decode()


def test_examples_pass_in_any_order_and_twice(tmp_path: Path, sq_env: dict[str, str]) -> None:
    # One home for all of them, as a reader trying each example in turn would have:
    # backwards, then forwards, so every example also meets its own leftovers.
    for where, code in [*reversed(EXAMPLES), *EXAMPLES]:
        out = run_example(code, tmp_path, sq_env)
        assert out.returncode == 0, f"{where}: {out.stderr.decode()}"
