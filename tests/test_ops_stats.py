"""Issue 26, point 7: `stats` talks in item texts, groups failure reasons that
differ only in numbers or quoted values, and names runners by host, start
time and command."""

from __future__ import annotations

import re
import subprocess

from statequeue import Queue
from statequeue.stats.figures import reason_pattern
from tests.conftest import STATEQUEUE


def test_reasons_that_differ_in_numbers_or_quoted_values_group_together() -> None:
    assert reason_pattern("model refused prompt 17") == reason_pattern("model refused prompt 18")
    assert reason_pattern("no file 'a.txt' at offset 3.5") == reason_pattern(
        "no file 'b c' at offset 12"
    )
    assert reason_pattern("HTTP 404 for job-007") == "HTTP N for job-N"
    assert reason_pattern("disk full") != reason_pattern("disk gone")


def test_stats_names_items_groups_reasons_and_describes_runners(sq_env: dict[str, str]) -> None:
    with Queue() as queue:
        queue.enqueue(["prompt-17", "prompt-18", "fine"])
        for item in queue.work():
            with item:
                if item.item.startswith("prompt-"):
                    raise RuntimeError(f"model refused prompt {item.item[7:]}")
    out = subprocess.run(
        [STATEQUEUE, "stats"], env=sq_env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    grouped = [line for line in lines if "model refused prompt" in line]
    assert len(grouped) == 1, lines
    assert re.search(r"model refused prompt N +2 +e\.g\. #1 prompt-17 \(attempt 1\)", grouped[0]), (
        grouped
    )
    slowest = lines[lines.index("slowest 1:") + 1]
    assert slowest.endswith("#3 fine  (attempt 1)"), slowest
    runner = lines[lines.index("runners:") + 1]
    assert re.match(
        r"  [0-9a-f]{8} on \S+, started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d: python ", runner
    ), runner
