"""Long items are printed whole in text output (an outside tester's finding).

`list` and `results` cut the item column at 200 characters with an ellipsis,
`show` its first line too, and `run`'s plain progress lines at 2,000, though
`help commands` says run prints "the whole item, never cut": `statequeue list
-s failed | cut -f4 | xargs ...` silently got wrong items. Text output for
pipelines and logs names the whole item (escaped, never cut), as GNU parallel
and xargs never cut an argument in what they log.
"""

from __future__ import annotations

import subprocess

from tests.conftest import STATEQUEUE

DEADLINE = 60.0


def _sq(
    env: dict[str, str], *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )


def test_list_results_show_and_run_print_the_whole_item(sq_env: dict[str, str]) -> None:
    url = "https://example.org/" + "a" * 300 + "?page=END"
    huge = "N" * 3000 + "\tEND"  # a tab: escaped as \t, still whole
    added = _sq(sq_env, "enqueue", stdin=f"{url}\n{huge}\n")
    assert added.returncode == 0, added.stderr
    run = _sq(sq_env, "run", "--no-live", "--", "true")
    assert run.returncode == 0, run.stderr
    lines = [x for x in run.stderr.splitlines() if x.startswith("[ok] ")]
    assert lines[0].startswith(f"[ok] #1 {url} ("), lines[0][-60:]
    assert lines[1].startswith("[ok] #2 " + "N" * 3000 + "\\tEND ("), lines[1][-60:]
    assert "…" not in run.stderr

    listed = _sq(sq_env, "list")
    assert listed.returncode == 0, listed.stderr
    column = [line.split("\t")[3] for line in listed.stdout.splitlines()]
    assert column == [url, "N" * 3000 + "\\tEND"]

    results = _sq(sq_env, "results")
    assert results.returncode == 0, results.stderr
    assert [line.split("\t")[2] for line in results.stdout.splitlines()] == column

    for item_id, text in (("1", url), ("2", column[1])):
        shown = _sq(sq_env, "show", item_id)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.splitlines()[0] == f"item {item_id}: {text}"
