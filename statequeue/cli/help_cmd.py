"""`statequeue help [TOPIC]`: the reference pages shipped inside the package.

The README stays short; the reference lives here, in Markdown files under
`cli/topics/`, so that it travels with the installed tool and matches its version.
Two pages cannot drift from the code because parts of them are generated when
shown: `commands` from each command's own --help, `exit-codes` from `ExitCode`.
rich draws a page only on a terminal (imported lazily: start-up time); a pipe
gets the Markdown source as it is.
"""

from __future__ import annotations

import sys
from typing import Annotated

import click
import typer

from statequeue.cli.command_table import full_group
from statequeue.cli.root import app
from statequeue.core.errors import UsageError
from statequeue.core.exitcodes import ExitCode

TOPICS: dict[str, str] = {
    "commands": "every command and its options (generated from --help), with usage notes",
    "python": "the library: Queue, work(), map, resumable, asyncio, errors",
    "workers": "persistent workers: run --persistent, the protocol, statequeue.serve",
    "guarantees": "the six promises: what is covered, what is not, which tests",
    "exit-codes": "every exit code and what it means",
    "report": "the HTML report: what each chart answers, offline, dark mode, print",
    "postgres": "runners on many machines: the PostgreSQL store, leases, fencing",
    "rates": "run --rate, exit 75 (try later), AIMD, TryLater in the library",
    "internals": "where data lives, the journal format, locks, compaction",
    "performance": "today's benchmark figures and the machine they came from",
    "architecture": "for the next engineer: the layers, the map of the package, where things go",
}
"""Every topic, in the order `statequeue help` lists them, with its one-line summary."""

GENERATED_MARK = "<!-- generated: {} -->"
"""A page line that is replaced, when the page is shown, by what the code generates."""

HELP_WIDTH = 100
"""The width the generated --help text is wrapped at, whatever the terminal's."""


def command_help(command: click.Command, path: list[str]) -> str:
    """The plain-text --help of ``command``, called as ``statequeue PATH...``.

    The same click formatting `--help` uses, without the rich panels, so that the
    page reads the same on a terminal, in a pipe and in a diff.
    """
    top = full_group()
    # The chain of contexts --help would have: settings such as -h pass down from the top.
    ctx = top.context_class(top, info_name="statequeue", **top.context_settings)
    for name in path:
        parent = ctx.command
        sub = parent.commands[name] if isinstance(parent, click.Group) else command
        ctx = sub.context_class(sub, parent=ctx, info_name=name, **sub.context_settings)
    formatter = click.HelpFormatter(width=HELP_WIDTH, max_width=HELP_WIDTH)
    # click.Command's own format_help: typer's override would print rich panels instead.
    click.Command.format_help(command, ctx, formatter)
    # typer escapes "[" in option texts for rich markup; plain text wants it back.
    return formatter.getvalue().replace("\\[", "[").rstrip() + "\n"


def every_command() -> list[tuple[list[str], click.Command]]:
    """Each command as (its words after `statequeue`, the click command), sub-commands too."""
    found: list[tuple[list[str], click.Command]] = []

    def walk(command: click.Command, path: list[str]) -> None:
        if isinstance(command, click.Group):
            for name in sorted(command.commands):
                walk(command.commands[name], [*path, name])
        elif not command.hidden:
            found.append((path, command))

    walk(full_group(), [])
    return found


def commands_reference() -> str:
    """Markdown: one section per command holding its --help text."""
    parts = []
    for path, command in every_command():
        name = " ".join(path)
        parts.append(f"### `statequeue {name}`\n\n```text\n{command_help(command, path)}```\n")
    return "\n".join(parts)


def exit_codes_table() -> str:
    """Markdown: the table of every `ExitCode`, its number, name and meaning."""
    rows = ["| code | name | meaning |", "|---|---|---|"]
    rows += [f"| {code.value} | `{code.name}` | {code.meaning} |" for code in ExitCode]
    return "\n".join(rows) + "\n"


_GENERATORS = {"commands": commands_reference, "exit-codes": exit_codes_table}


def page_source(topic: str) -> str:
    """The Markdown of ``topic``, with its generated parts filled in."""
    if topic not in TOPICS:
        raise UsageError(f"no help topic {topic!r}; the topics are: {', '.join(TOPICS)}")
    from importlib.resources import files  # lazy: start-up time (~3 ms, for every command)

    text = files("statequeue.cli").joinpath("topics", f"{topic}.md").read_text(encoding="utf-8")
    for name, generate in _GENERATORS.items():
        mark = GENERATED_MARK.format(name)
        if mark in text:
            text = text.replace(mark, generate().rstrip("\n"))
    return text


def topics_listing() -> str:
    """What `statequeue help` prints: each topic and its summary."""
    width = max(map(len, TOPICS))
    lines = [f"  {name:<{width}}  {summary}" for name, summary in TOPICS.items()]
    return "Topics (statequeue help TOPIC):\n" + "\n".join(lines) + "\n"


def show_page(text: str) -> None:
    """Draw ``text`` with rich on a terminal; print the Markdown as it is otherwise."""
    if not sys.stdout.isatty():
        sys.stdout.write(text)
        return
    from rich.console import Console  # lazy: start-up time
    from rich.markdown import Markdown  # lazy: start-up time

    Console().print(Markdown(text, code_theme="ansi_dark"))


@app.command("help")
def help_command(
    topic: Annotated[
        str | None,
        typer.Argument(help=f"One of: {', '.join(TOPICS)}.", show_default=False),
    ] = None,
) -> None:
    """Read a reference page; with no TOPIC, list the topics.

    On a terminal the page is drawn with rich; piped, it is printed as Markdown.
    An unknown TOPIC is one line on stderr and exit 2.

    Example: statequeue help (the list); statequeue help guarantees | less
    """
    if topic is None:
        sys.stdout.write(topics_listing())
        return
    show_page(page_source(topic))
