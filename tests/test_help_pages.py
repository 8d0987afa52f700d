"""`statequeue help [TOPIC]` and the pages it shows (issue 22 items 6 and 7): every topic
has its page, the generated parts match the code they come from, the README stays short
and its quick start runs exactly as written."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from statequeue.cli.app import app
from statequeue.cli.help_cmd import TOPICS, command_help, every_command, page_source
from statequeue.core.exitcodes import MEANINGS, ExitCode

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "statequeue" / "cli" / "topics"
REQUIRED = {"commands", "python", "guarantees", "exit-codes", "postgres", "internals"}
REQUIRED |= {"performance", "architecture"}


def test_every_topic_has_a_page_and_every_page_a_topic() -> None:
    assert set(TOPICS) >= REQUIRED
    assert {page.stem for page in PAGES.glob("*.md")} == set(TOPICS)


def test_help_lists_the_topics() -> None:
    result = CliRunner().invoke(app, ["help"])
    assert result.exit_code == 0
    for name, summary in TOPICS.items():
        assert re.search(rf"^\s+{re.escape(name)}\s+{re.escape(summary)}$", result.output, re.M)


@pytest.mark.parametrize("topic", list(TOPICS))
def test_each_page_prints_as_markdown_when_piped(topic: str) -> None:
    result = CliRunner().invoke(app, ["help", topic])
    assert result.exit_code == 0
    assert result.output == page_source(topic)
    assert result.output.startswith("# ")
    assert "<!-- generated" not in result.output


def test_a_page_is_drawn_with_rich_on_a_terminal(sq_env: dict[str, str]) -> None:
    # `script` gives the command a terminal; rich then draws the headings, not the "#".
    command = "statequeue help exit-codes"
    out = subprocess.run(
        ["script", "-qec", command, "/dev/null"], env={**sq_env, "COLUMNS": "200"},
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    if out.returncode == 127 or b"not found" in out.stderr:
        pytest.skip("no `script` to give a terminal")
    text = out.stdout.decode()
    assert out.returncode == 0, out.stderr.decode()
    assert "exit codes" in text and "# exit codes" not in text
    assert "STORE_UNREACHABLE" in text


def test_an_unknown_topic_is_one_line_and_exit_2(sq_env: dict[str, str]) -> None:
    out = subprocess.run(
        ["statequeue", "help", "nosuch"], env=sq_env, capture_output=True, timeout=60, check=False
    )
    assert out.returncode == ExitCode.USAGE
    assert out.stdout == b""
    lines = out.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("statequeue: no help topic 'nosuch'")


def test_help_has_help_with_an_example() -> None:
    result = CliRunner().invoke(app, ["help", "--help"])
    assert result.exit_code == 0
    assert "Example: statequeue help" in result.output
    assert "statequeue help guarantees" in result.output


def section(page: str, name: str) -> str:
    match = re.search(rf"### `statequeue {re.escape(name)}`\n\n```text\n(.*?)```", page, re.S)
    assert match, f"no section for `{name}` in the commands page"
    return match.group(1)


def test_the_commands_page_holds_every_commands_help() -> None:
    page = page_source("commands")
    top = typer.main.get_command(app)
    assert isinstance(top, click.Group)
    names = {" ".join(path) for path, _ in every_command()}
    assert set(top.commands) - {"db"} <= names and "db migrate" in names
    for path, command in every_command():
        assert section(page, " ".join(path)) == command_help(command, path)


@pytest.mark.parametrize("path", [path for path, _ in every_command()], ids=" ".join)
def test_the_commands_page_says_what_help_says(path: list[str]) -> None:
    # The real --help (rich panels) against the page's plain text: every word of
    # --help is on the page (rich lists an option's short flag after its long one).
    # Wide, so that rich cuts no word short; words compared without case (IDS / ids).
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0
    words = {w.lower() for w in re.findall(r"[\w\-.']+", result.output) if w.strip("-.'")}
    # rich alone names each argument's parameter in a column of its own.
    command = next(command for where, command in every_command() if where == path)
    words -= {p.name for p in command.params if isinstance(p, click.Argument)}
    page = section(page_source("commands"), " ".join(path)).lower()
    page_words = set(re.findall(r"[\w\-.']+", re.sub(r"-\n\s+", "-", page)))
    assert words <= page_words, f"`{' '.join(path)} --help` says what the page does not"


def test_the_exit_codes_page_is_generated_from_exit_code() -> None:
    page = page_source("exit-codes")
    assert set(MEANINGS) == set(ExitCode)
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \| (.*) \|$", page, re.M)
    assert [(int(code), name) for code, name, _ in rows] == [(c.value, c.name) for c in ExitCode]
    assert [meaning for *_, meaning in rows] == [code.meaning for code in ExitCode]


def test_the_readme_is_short_and_points_at_every_topic() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    for name in TOPICS:
        assert f"`{name}`" in text, name


def quick_start() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("\n## Quick start\n", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_quick_start_runs_exactly_as_written(sq_env: dict[str, str]) -> None:
    codes = []
    for line in quick_start():
        out = subprocess.run(
            ["bash", "-c", line], cwd=ROOT, env=sq_env, capture_output=True, timeout=300
        )
        assert b"Traceback" not in out.stderr, line
        codes.append((shlex.split(line)[0:3], out.returncode))
    # The first run meets the worker's planned failures (exit 1); every other line succeeds.
    assert [code for _, code in codes] == [0, 1, 0, 0, 0, 0, 0, 0], codes
    status = subprocess.run(
        ["statequeue", "status", "--json"], env=sq_env, capture_output=True, timeout=60
    )
    assert b'"done":120' in status.stdout.replace(b" ", b""), status.stdout
