"""`report` as an outside review of its page found it (one test per finding):
what the page says must be true of what it shows, every cut list says what
it left out, and no text is cut without a mark."""

from __future__ import annotations

import os
import re
import subprocess
import time

from statequeue.api.queue import Queue
from statequeue.cli.report_page import render_report
from statequeue.core.models import Outcome, RunnerInfo
from statequeue.stats.attempts import Attempt, batches_of
from statequeue.stats.report_fold import TIMELINE_UNSUCCESSFUL, ReportFold
from statequeue.stats.report_model import FAILED, Report
from tests.conftest import STATEQUEUE


def _page(env: dict[str, str], *args: str) -> str:
    return subprocess.run(
        [STATEQUEUE, "report", "-o", "-", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout


def _header_row(page: str, name: str) -> str:
    found = re.search(f"<dt>{name}</dt><dd>(.*?)</dd>", page)
    assert found is not None, name
    return found.group(1)


def test_a_window_with_no_attempt_has_no_success_rate(sq_env: dict[str, str]) -> None:
    """`report --since` over a stretch in which nothing ran said "100.0% of
    finished items" (the queue's counts now, not the window's): now "-". A
    window's rate is of the items its attempts finished."""
    with Queue() as q:
        q.enqueue(["a", "b", "c"])
        for item in q.work():
            with item:
                if item.item == "c":
                    item.fail("boom")
        assert q.report().success_rate == 2 / 3
        assert q.report(60).success_rate == 2 / 3  # all of it in the last minute
        empty = q.report(60, now=time.time() + 3600)
        assert empty.success_rate is None and empty.figures.attempts == 0
    assert _header_row(_page(sq_env), "success rate") == "66.7% of finished items"
    time.sleep(1.1)
    rate = _header_row(_page(sq_env, "--since", "1s"), "success rate")
    assert rate.startswith("- of items finished in the last 1s"), rate


def _cut_report(*, failures: int, reasons: int, retried: int, commands: int) -> Report:
    """A report of 4,000 attempts: ``failures`` of them failed for one of
    ``reasons`` exit codes, ``retried`` items tried twice, ``commands`` runs."""
    rows = []
    for i in range(1, 4001):
        ok = i > failures
        state = "done" if ok else "failed"
        code = None if ok else i % reasons + 1
        rows.append(Attempt(i, 1, state, ok, 0.5, "", code, None, False, "r", "h", 1000.0 + i))
    rows += [
        Attempt(i, 2, "done", True, 0.5, "", 0, None, False, "r", "h", 6000.0 + i)
        for i in range(4001 - retried, 4001)
    ]
    fold = ReportFold()
    fold.add_all(batches_of(rows))
    figures = fold.build()
    return Report(
        queue="q",
        store="journal",
        now=9000.0,
        since=None,
        counts={"done": 4000 - failures, "failed": failures},
        commands=tuple(f"./step {n}" for n in range(commands)),
        active_runners=0,
        figures=figures,
    )


def test_the_sampled_timeline_says_how_many_unsuccessful_attempts_it_shows() -> None:
    """The note said "the slowest and the unsuccessful ones are all kept",
    but past TIMELINE_UNSUCCESSFUL (700) the unsuccessful ones are sampled
    too: now it says how many it shows of how many."""
    many = _cut_report(failures=1000, reasons=3, retried=0, commands=1)
    t = many.figures.timeline
    # At least TIMELINE_UNSUCCESSFUL of them; the even stride through the rest meets more.
    assert t.unsuccessful == 1000 and TIMELINE_UNSUCCESSFUL <= t.unsuccessful_shown < 1000
    assert sum(1 for b in t.bars if b.kind == FAILED) == t.unsuccessful_shown
    page = render_report(many)
    assert "are all kept" not in page
    assert (
        f"Showing {t.shown} of 4000 attempts: the slowest ones, {t.unsuccessful_shown} "
        "of the 1000 unsuccessful ones (sampled evenly), and the rest sampled evenly."
    ) in page
    few = _cut_report(failures=100, reasons=3, retried=0, commands=1)
    assert "the slowest ones, all 100 unsuccessful ones, and the rest" in render_report(few)


def test_every_cut_list_says_how_many_it_left_out() -> None:
    """Failure reasons past 50 and commands past 10 were dropped without a
    word; the most retried and slowest tables did not say they are the top
    ones of more."""
    r = _cut_report(failures=60, reasons=60, retried=12, commands=13)
    assert len(r.figures.failures) == 60
    page = render_report(r)
    assert page.count("<td>exit code ") == 50
    assert "and 10 more reasons (10 attempts), not listed" in page
    shown = re.findall(r"<code>\./step (\d+)</code>", page)
    assert shown == [str(n) for n in range(3, 13)]  # the latest ten
    assert "and 3 earlier ones (the last 10 shown)" in page
    assert "10 of 12 retried items (the most attempts first) shown; 2 more not listed." in page
    assert "10 of 4012 attempts (the slowest first) shown; 4002 more not listed." in page
    small = render_report(_cut_report(failures=3, reasons=3, retried=2, commands=2))
    assert "more reasons" not in small and "earlier ones" not in small
    assert "retried items (the most attempts first)" not in small


def test_the_most_retried_table_has_one_attempts_column() -> None:
    """It had both "attempt" and "attempts", the same number twice."""
    page = render_report(_cut_report(failures=0, reasons=1, retried=3, commands=1))
    table = page.split("<h2>Most retried items</h2>")[1].split("</table>")[0]
    assert "<th>attempt</th>" not in table and table.count("<th>attempts</th>") == 1
    assert table.count("<td class='n'>2</td>") == 3  # each item's attempts, once


def test_a_cut_item_text_ends_with_an_ellipsis(sq_env: dict[str, str]) -> None:
    """Item texts past 300 characters were cut with no mark: a reader took
    the 300 for the whole item."""
    long, short = "x" * 299 + "END-OF-ITEM", "y" * 300
    with Queue() as q:
        q.enqueue([long, short])
        for item in q.work():
            with item:
                item.fail("boom")
        shown = {g.reason: g.examples for g in q.report().figures.failures}["boom"]
    assert shown == ("x" * 299 + "…", short)  # 300 characters each, the cut one marked
    page = _page(sq_env)
    assert "x" * 299 + "…<" in page and "END-OF-ITEM" not in page
    assert short + "<" in page


def test_runner_and_host_reach_the_page_without_control_characters(
    sq_env: dict[str, str],
) -> None:
    """A runner's id and host come from the records (STATEQUEUE_HOST, the
    library's RunnerInfo) and reached the page raw: an ESC or BEL in the
    header, the hosts line and the timeline's lane labels and hover texts.
    Now they are shown as every terminal view shows them (``\\x1b``)."""
    runner = RunnerInfo("run\x1b[2J", os.getpid(), "box\x07\x1b[31m", "", time.time())
    with Queue() as q:
        q.enqueue(["a"])
        q.register_runner(runner)
        claim = q.claim(runner)
        assert claim is not None
        q.store.finish(claim, Outcome(ok=True, duration=0.1, exit_code=0))
        page = render_report(q.report())
    assert "run\\x1b[2J (box\\a\\x1b[31m): 1" in page  # the header's runners
    assert "<dt>hosts</dt><dd>box\\a\\x1b[31m</dd>" in page
    assert ">run\\x1b[2J #1</text>" in page  # the lane's label
    assert "on run\\x1b[2J #1" in page  # its bar's hover text
    assert not any(chr(c) in page for c in (*range(0x20), 0x7F) if chr(c) != "\n")
