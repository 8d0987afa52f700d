"""The HTML report in a real headless Chromium (issue 25): made by the real
`statequeue report`, opened from disk, it throws no JavaScript error, draws
its charts (SVG marks in the rendered DOM), shows details on hover, follows
the browser's dark mode, prints, fetches nothing, and its screenshot is not
blank. Chromium comes from Debian's package (tests/browser.py installs it);
under STATEQUEUE_REQUIRE_BROWSER=1 (.ci/run) a missing browser fails."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statequeue.api.queue import Queue
from tests import browser
from tests.browser import Browser, png_colours
from tests.conftest import STATEQUEUE
from tests.killed_run import run_killed_running_two
from tests.test_stats import fill


@pytest.fixture(scope="session")
def chromium() -> str:
    """The browser's path, installed once per session when absent."""
    return browser.need_chromium()


@pytest.fixture
def page(chromium: str, tmp_path: Path) -> Iterator[Browser]:
    b = Browser(chromium, tmp_path / "profile")
    try:
        b.page("Network.enable")
        b.page(
            "Emulation.setDeviceMetricsOverride",
            width=1100,
            height=900,
            deviceScaleFactor=1,
            mobile=False,
        )
        yield b
    finally:
        b.close()


def _report(sq_env: dict[str, str], out: Path) -> Path:
    fill(lambda: Queue("shown"))
    done = subprocess.run(
        [STATEQUEUE, "-q", "shown", "report", "-o", str(out)],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out


def _open(b: Browser, path: Path) -> None:
    b.page("Page.navigate", url=path.as_uri())
    b.wait_event("Page.loadEventFired")


def _eval(b: Browser, expression: str) -> Any:
    found = b.page("Runtime.evaluate", expression=expression, returnByValue=True)
    assert "exceptionDetails" not in found, found
    return found["result"].get("value")


def _screenshot(b: Browser) -> bytes:
    shot = b.page("Page.captureScreenshot", format="png", captureBeyondViewport=True)
    return base64.b64decode(shot["data"])


def test_report_renders_in_chromium(page: Browser, sq_env: dict[str, str], tmp_path: Path) -> None:
    path = _report(sq_env, tmp_path / "report.html")
    _open(page, path)
    assert _eval(page, "document.documentElement.getAttribute('data-ready')") == "1"
    assert _eval(page, "document.querySelectorAll('svg.chart').length") == 3
    marks = _eval(
        page,
        "Array.from(document.querySelectorAll('svg.chart')).map("
        "s => s.querySelectorAll('.mark').length)",
    )
    assert marks[0] >= 2 and marks[1] == 40 and marks[2] >= 5, marks  # 40 attempts
    box = _eval(
        page,
        "(() => { const r = document.querySelectorAll('svg.chart')[1]"
        ".getBoundingClientRect(); return [r.width, r.height]; })()",
    )
    assert box[0] > 500 and box[1] > 100, box  # laid out, not collapsed
    assert _eval(page, "document.querySelectorAll('table tr').length") > 10
    text = _eval(page, "document.body.innerText")
    assert "1 retries (failed or deferred, then put back)" in text and "item-31" in text
    assert png_colours(_screenshot(page)) > 20  # text, charts in several colours

    # Details on hover: the pointer over a timeline bar shows its attempt.
    x, y = _eval(
        page,
        "(() => { const r = document.querySelectorAll('svg.chart')[1]"
        ".querySelector('.mark').getBoundingClientRect();"
        " r.top < 0 || r.bottom > innerHeight ? scrollTo(0, scrollY + r.top - 100) : 0;"
        " const s = document.querySelectorAll('svg.chart')[1].querySelector('.mark')"
        ".getBoundingClientRect(); return [s.left + 2, s.top + s.height / 2]; })()",
    )
    page.page("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
    tip = _eval(
        page,
        "(() => { const t = document.getElementById('tip');"
        " return [getComputedStyle(t).display, t.textContent]; })()",
    )
    assert tip[0] == "block" and tip[1].startswith("item "), tip

    # Nothing but the file itself was requested.
    requested = [
        e["params"]["request"]["url"]
        for e in page.events
        if e.get("method") == "Network.requestWillBeSent"
    ]
    assert requested and all(url.startswith("file://") for url in requested), requested
    assert page.errors() == []


def test_dark_mode_and_print(page: Browser, sq_env: dict[str, str], tmp_path: Path) -> None:
    path = _report(sq_env, tmp_path / "report.html")
    background = "getComputedStyle(document.body).backgroundColor"
    _open(page, path)
    light = _eval(page, background)
    page.page(
        "Emulation.setEmulatedMedia",
        features=[{"name": "prefers-color-scheme", "value": "dark"}],
    )
    dark = _eval(page, background)
    assert light == "rgb(255, 255, 255)" and dark != light, (light, dark)
    assert png_colours(_screenshot(page)) > 20
    page.page("Emulation.setEmulatedMedia", media="print")
    assert _eval(page, "getComputedStyle(document.getElementById('tip')).display") == "none"
    pdf = base64.b64decode(page.page("Page.printToPDF")["data"])
    assert pdf.startswith(b"%PDF") and len(pdf) > 10_000
    assert page.errors() == []


def test_a_downsampled_report_renders(page: Browser, tmp_path: Path) -> None:
    """20,000 synthetic attempts on 8 runners (page rendered without a store):
    the timeline draws the sample it was given, and the page stays small."""
    from statequeue.cli.report_page import render_report
    from statequeue.stats.attempts import Attempt, batches_of
    from statequeue.stats.report_fold import TIMELINE_LIMIT, ReportFold
    from statequeue.stats.report_model import Report

    def attempt(i: int) -> Attempt:
        ok = i % 97 != 0
        duration = 30.0 if i % 1000 == 0 else 0.2 + (i % 13) / 10
        return Attempt(
            i, 1, "done" if ok else "failed", ok, duration, "" if ok else "exit code 2",
            0 if ok else 2, None, False, f"runner-{i % 8}", f"host-{i % 2}", 1e9 + i / 4,
        )  # fmt: skip

    fold = ReportFold()
    fold.add_all(batches_of(attempt(i) for i in range(1, 20_001)))
    figures = fold.build()
    assert figures.timeline.shown <= TIMELINE_LIMIT < figures.timeline.total
    report = Report("big", "memory", 1e9 + 6000, None, {"done": 19_794}, (), 0, figures)
    path = tmp_path / "big.html"
    path.write_text(render_report(report))
    assert path.stat().st_size < 2_000_000
    _open(page, path)
    marks = _eval(
        page,
        "Array.from(document.querySelectorAll('svg.chart')).map("
        "s => s.querySelectorAll('.mark').length)",
    )
    assert marks[1] == figures.timeline.shown, marks
    assert png_colours(_screenshot(page)) > 20
    assert page.errors() == []


def test_attempts_in_flight_when_their_runner_died(
    page: Browser, sq_env: dict[str, str], sq_home: Path, tmp_path: Path
) -> None:
    """A run (-j2) killed with -9 while it ran two items, not recovered yet:
    the two attempts are drawn in their own slots, each to the time of the
    report (the right end of the timeline), and the header names the dead
    runner with its host."""
    out = tmp_path / "died.html"
    with run_killed_running_two(sq_env, sq_home, "", tmp_path, ["a", "b", "c"]) as runner:
        made = subprocess.run(
            [STATEQUEUE, "report", "-o", str(out)], env=sq_env, capture_output=True, timeout=120
        )
        assert made.returncode == 0, made.stderr
    _open(page, out)
    bars = _eval(
        page,
        "Array.from(document.querySelectorAll('svg.chart')[1].querySelectorAll('.mark'))"
        ".filter(m => m.getAttribute('data-tip').includes('in flight when its runner died'))"
        ".map(m => { const r = m.getBoundingClientRect(); return [r.top, r.right]; })",
    )
    axis = _eval(
        page,
        "document.querySelectorAll('svg.chart')[1].querySelector('line.axis')"
        ".getBoundingClientRect().right",
    )
    assert len(bars) == 2 and bars[0][0] != bars[1][0], bars  # slots #1 and #2
    assert all(abs(right - axis) < 1 for _, right in bars), (bars, axis)  # to the report
    text = _eval(page, "document.body.innerText")
    assert f"1 (0 alive now): {runner.runner_id} ({runner.host}): 2" in text, text[:800]
    assert "to the time of this report" in text
    assert page.errors() == []


def test_attempts_a_dead_runners_processes_still_run(
    page: Browser, sq_env: dict[str, str], sq_home: Path, tmp_path: Path
) -> None:
    """The run and its keeper killed with -9, the items' processes live on:
    the page shows their two attempts in flight, as `status` lists them
    ("still run by processes of a dead runner"), their state now orphaned."""
    out = tmp_path / "held.html"
    with run_killed_running_two(sq_env, sq_home, "", tmp_path, ["a", "b", "c"], keeper_too=True):
        made = subprocess.run(
            [STATEQUEUE, "report", "-o", str(out)], env=sq_env, capture_output=True, timeout=120
        )
        assert made.returncode == 0, made.stderr
    _open(page, out)
    bars = _eval(
        page,
        "Array.from(document.querySelectorAll('svg.chart')[1].querySelectorAll('.mark'))"
        ".filter(m => m.getAttribute('data-tip').includes('in flight when its runner died'))"
        ".length",
    )
    assert bars == 2
    text = _eval(page, "document.body.innerText")
    assert "not recovered yet (2 still run by processes of a dead runner)" in text, text[:800]
    assert "Of these, 2 (state now: orphaned) are still run by processes" in text
    assert text.count("orphaned") == 3, text  # the sentence and the two rows' state now
    assert page.errors() == []


def test_require_browser_turns_a_skip_into_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser, "chromium_path", lambda: None)
    monkeypatch.delenv("STATEQUEUE_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception):
        browser.need_chromium()
    monkeypatch.setenv("STATEQUEUE_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="STATEQUEUE_REQUIRE_BROWSER=1"):
        browser.need_chromium()
