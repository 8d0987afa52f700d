"""The import-layer contract of the statequeue package, checked by `make lint`.

DESIGN.md: the package's folders are its layers, core <- stats <- store <- api
<- run <- cli, and each imports only the layers below it. This script reads every
module with ast (module-level, function-local and TYPE_CHECKING imports alike)
and prints one line per offence, exiting 1 if there is any:

- a wrong-way import (a layer importing one above it, or the top-level package);
- an import of store/journal/* or store/postgres/* from outside store/;
- a runtime import cycle: at import time (module-level imports), or closed by
  a function-local import that only dodges it (TYPE_CHECKING imports never
  run and do not count);
- ``from M import _private`` (or ``M._private``) across modules;
- a function-local import with no ``# lazy: REASON`` comment on its line or
  just above (a reader must tell start-up time from a dodged cycle).

The top-level ``__init__.py`` (the lazy public names), ``__main__.py`` and the
``maintenance.py`` shim may import any layer. With ``--counts`` it also prints
the figures the issue's closing note asks for.

Usage: python scripts/check_layers.py [--counts] [PACKAGE_DIR]
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

LAYERS = ("core", "stats", "store", "api", "run", "cli")
ORDER = " <- ".join(LAYERS)
INTERNALS = ("store.journal", "store.postgres")  # below the store contract: store/ only
MAX_LINES = 500
LONG_ALLOWED = {"run.keeper_process"}  # runs alone under `python -I -S` (issue 22 point 4)


@dataclass(frozen=True)
class Import:
    """One import statement's edge from a module to a module of the package."""

    importer: str  # dotted, without the package name ("" for the package itself)
    target: str
    line: int
    names: tuple[str, ...]  # for ``from M import a, b``
    runtime: bool  # module level and not under ``if TYPE_CHECKING``
    local: bool  # inside a function
    type_only: bool  # under ``if TYPE_CHECKING``: never run


@dataclass
class Module:
    name: str
    path: Path
    lines: int
    imports: list[Import]
    private_uses: list[tuple[int, str, str]]  # (line, module, name) for ``m._name``
    foreign_private: list[tuple[int, str]] = field(default_factory=list)
    """``obj._name`` on an object not of this module (a heuristic: counted, not failed)."""
    local_imports: int = 0
    local_with_reason: int = 0
    local_for_startup: int = 0
    local_unexplained: list[int] = field(default_factory=list)
    """Lines of function-local imports with no ``# lazy:`` reason."""


def module_names(root: Path) -> dict[str, Path]:
    """Every module under ``root``, by dotted name relative to the package."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` (relative to the package) names."""
    parts = name.split(".") if name else []
    while True:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        if not parts:
            return None
        parts.pop()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


Walked = tuple[ast.Import | ast.ImportFrom, bool, bool, bool]


def _walk(node: ast.AST, *, local: bool = False, type_only: bool = False) -> Iterator[Walked]:
    """Every import statement under ``node``: (statement, runs at import time,
    inside a function, under ``if TYPE_CHECKING``)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, not (local or type_only), local, type_only
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _walk(child, local=True, type_only=type_only)
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _walk(_wrap(stmt), local=local, type_only=True)
            for stmt in child.orelse:
                yield from _walk(_wrap(stmt), local=local, type_only=type_only)
        else:
            yield from _walk(child, local=local, type_only=type_only)


def _wrap(stmt: ast.stmt) -> ast.Module:
    return ast.Module(body=[stmt], type_ignores=[])


def _reason(source: list[str], line: int) -> str:
    """The ``# lazy: ...`` reason on an import's line or the comment lines just above
    the run of imports it belongs to ("" if none)."""
    text = source[line - 1]
    if "# lazy:" in text:
        return text.split("# lazy:", 1)[1]
    i = line - 2
    while i >= 0 and source[i].strip().startswith(("import ", "from ")):
        if "# lazy:" in source[i]:
            return source[i].split("# lazy:", 1)[1]
        i -= 1
    while i >= 0 and source[i].strip().startswith("#"):
        if "lazy:" in source[i]:
            return source[i].split("lazy:", 1)[1]
        i -= 1
    return ""


def read_module(name: str, path: Path, package: str, known: dict[str, Path]) -> Module:
    text = path.read_text()
    tree = ast.parse(text, filename=str(path))
    source = text.splitlines()
    module = Module(name, path, len(source), [], [])
    is_package = path.name == "__init__.py"
    aliases: dict[str, str] = {}  # local name -> module of the package it is bound to
    for stmt, runtime, local, type_only in _walk(tree):
        if local:
            module.local_imports += 1
            reason = _reason(source, stmt.lineno)
            if reason:
                module.local_with_reason += 1
                if "start-up" in reason or "startup" in reason:
                    module.local_for_startup += 1
            else:
                module.local_unexplained.append(stmt.lineno)
        for target, names, bound in _targets(stmt, name, is_package, package, known):
            edge = Import(name, target, stmt.lineno, names, runtime, local, type_only)
            module.imports.append(edge)
            aliases.update(bound)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and _private(node.attr)
        ):
            module.private_uses.append((node.lineno, aliases[node.value.id], node.attr))
    module.foreign_private = _foreign_private(tree)
    return module


# Private by convention only: the namedtuple API, and the stdlib's documented escapes.
_NOT_PRIVATE = {"_replace", "_make", "_asdict", "_fields", "_exit", "_getframe"}


def _foreign_private(tree: ast.Module) -> list[tuple[int, str]]:
    """``x._name`` where ``x`` is neither ``self``, ``cls``, ``super()`` nor a class
    of this module: most likely a private member of another module's object
    (as ``store._locked`` in online compaction)."""
    own = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)} | {"self", "cls"}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        if node.attr in _NOT_PRIVATE or not isinstance(node.value, ast.Name):
            continue
        if node.value.id not in own:
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return sorted(found)


def _targets(
    stmt: ast.stmt, importer: str, is_package: bool, package: str, known: dict[str, Path]
) -> Iterator[tuple[str, tuple[str, ...], dict[str, str]]]:
    """(module imported, names taken from it, local names bound to modules) per edge."""
    if isinstance(stmt, ast.Import):
        for alias in stmt.names:
            if alias.name == package or alias.name.startswith(package + "."):
                target = resolve(alias.name[len(package) + 1 :], known)
                if target is not None:
                    bound = {alias.asname: target} if alias.asname else {}
                    yield target, (), bound
        return
    assert isinstance(stmt, ast.ImportFrom)
    if stmt.level:
        base = importer.split(".") if importer else []
        if not is_package:
            base = base[:-1]
        base = base[: len(base) - (stmt.level - 1)]
        dotted = ".".join([*base, *([stmt.module] if stmt.module else [])])
    elif stmt.module == package or (stmt.module or "").startswith(package + "."):
        dotted = (stmt.module or "")[len(package) + 1 :]
    else:
        return
    plain: list[str] = []
    for alias in stmt.names:
        sub = f"{dotted}.{alias.name}" if dotted else alias.name
        if sub in known:  # ``from pkg import submodule``: an edge to the submodule
            yield sub, (), {alias.asname or alias.name: sub}
        else:
            plain.append(alias.name)
    if plain:
        target = resolve(dotted, known)
        if target is not None:
            yield target, tuple(plain), {}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def layer(name: str) -> int | None:
    """The index of ``name``'s layer in LAYERS; None for a top-level module."""
    first = name.split(".")[0]
    return LAYERS.index(first) if first in LAYERS else None


def offences(modules: dict[str, Module], package: str) -> list[str]:
    lines = []
    for module in modules.values():
        where = module.path
        here = layer(module.name)
        for imp in module.imports:
            if imp.target == module.name:
                continue
            there = layer(imp.target)
            full = f"{package}.{imp.target}" if imp.target else package
            said = f"{where}:{imp.line}: {_dotted(package, module.name)} imports {full}"
            if here is not None and (there is None or there > here):
                what = "the top-level package" if there is None else LAYERS[there]
                lines.append(f"{said} ({LAYERS[here]} may not import {what}: {ORDER})")
            if _internal(imp.target) and layer(module.name) != LAYERS.index("store"):
                lines.append(f"{said} (store internals: only store/ imports {imp.target})")
            for name in imp.names:
                if _private(name):
                    lines.append(f"{said} (private name {name} taken from another module)")
        for line in module.local_unexplained:
            lines.append(
                f"{where}:{line}: a function-local import with no `# lazy: ...` reason"
                " (say why it is not at the top, or move it there)"
            )
        for line, target, name in module.private_uses:
            full = f"{package}.{target}" if target else package
            lines.append(
                f"{where}:{line}: {_dotted(package, module.name)} uses {full}.{name}"
                " (private name taken from another module)"
            )
    at_import = cycles(modules, local=False)
    for local in (False, True):
        for cycle, (path, line) in cycles(modules, local=local):
            if local and any(set(cycle) <= set(other) for other, _ in at_import):
                continue  # said once, as the cycle at import time
            shown = " -> ".join(_dotted(package, name) for name in (*cycle, cycle[0]))
            first, second = cycle[0], cycle[1 % len(cycle)]
            kind = "through a function-local import" if local else "at import time"
            lines.append(
                f"{path}:{line}: {_dotted(package, first)} imports {_dotted(package, second)}"
                f" (runtime import cycle {kind}: {shown})"
            )
    return lines


def _dotted(package: str, name: str) -> str:
    return f"{package}.{name}" if name else package


def _internal(target: str) -> bool:
    return any(target == inner or target.startswith(inner + ".") for inner in INTERNALS)


def runtime_graph(
    modules: dict[str, Module], *, local: bool
) -> dict[str, dict[str, tuple[Path, int]]]:
    """Edges that run (where each is made): at import time, and with ``local``
    those inside functions too."""
    graph: dict[str, dict[str, tuple[Path, int]]] = {name: {} for name in modules}
    for module in modules.values():
        for imp in module.imports:
            runs = imp.runtime or (local and not imp.type_only)
            if runs and imp.target != module.name:
                graph[module.name].setdefault(imp.target, (module.path, imp.line))
    return graph


def cycles(modules: dict[str, Module], *, local: bool) -> list[tuple[list[str], tuple[Path, int]]]:
    """One cycle per strongly connected component of the runtime graph (with
    ``local``, counting function-local imports), with where its first edge is made."""
    graph = runtime_graph(modules, local=local)
    found = []
    for component in _components(graph):
        members = set(component)
        start = min(members)
        cycle = _cycle_through(graph, start, members)
        found.append((cycle, graph[cycle[0]][cycle[1 % len(cycle)]]))
    return sorted(found, key=lambda c: c[0])


def _components(graph: dict[str, dict[str, tuple[Path, int]]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                result.append(component)

    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return result


def _cycle_through(
    graph: dict[str, dict[str, tuple[Path, int]]], start: str, members: set[str]
) -> list[str]:
    """The shortest cycle from ``start`` back to itself inside ``members`` (breadth first)."""
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(graph[node]):
                if nxt not in members:
                    continue
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return list(reversed(path))
                if nxt not in parents:
                    parents[nxt] = node
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    return [start]


def counts(modules: dict[str, Module], package: str) -> list[str]:
    crossing = sum(
        sum(1 for name in imp.names if _private(name))
        for module in modules.values()
        for imp in module.imports
        if imp.target != module.name
    ) + sum(len(module.private_uses) for module in modules.values())
    foreign = [(m.path, line, what) for m in modules.values() for line, what in m.foreign_private]
    long = sorted((m for m in modules.values() if m.lines > MAX_LINES), key=lambda m: m.name)
    long_counted = [m for m in long if m.name not in LONG_ALLOWED]
    top = [m for m in modules.values() if "." not in m.name and layer(m.name) is None]
    local = sum(m.local_imports for m in modules.values())
    reason = sum(m.local_with_reason for m in modules.values())
    startup = sum(m.local_for_startup for m in modules.values())
    found = cycles(modules, local=False)
    dodged = len(cycles(modules, local=True)) - len(found)
    return [
        f"runtime cycles: {len(found)} at import time, {dodged} more through function-local"
        " imports",
        f"private names crossing modules: {crossing} imported"
        f" + {len(foreign)} private members used on objects of other modules (heuristic):"
        + "".join(f"\n  {path}:{line}: {what}" for path, line, what in foreign),
        f"modules over {MAX_LINES} lines: {len(long_counted)}"
        + "".join(f"\n  {m.path} ({m.lines})" for m in long_counted)
        + "".join(f"\n  {m.path} ({m.lines}, excepted)" for m in long if m.name in LONG_ALLOWED),
        f"top-level modules: {len(top)} ({', '.join(sorted(m.path.name for m in top))})",
        f"function-local imports: {local}, with a `# lazy:` reason: {reason},"
        f" for start-up time: {startup}",
    ]


def check(root: Path) -> tuple[dict[str, Module], str]:
    package = root.name
    known = module_names(root)
    modules = {name: read_module(name, path, package, known) for name, path in known.items()}
    return modules, package


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--counts", action="store_true", help="also print the closing note's figures"
    )
    default = Path(__file__).resolve().parent.parent / "statequeue"
    parser.add_argument("package", nargs="?", type=Path, default=default)
    args = parser.parse_args(argv)
    root: Path = args.package
    modules, package = check(root)
    base = root.parent
    for module in modules.values():
        module.path = (
            module.path.relative_to(base) if module.path.is_relative_to(base) else module.path
        )
    found = offences(modules, package)
    for line in found:
        print(line)
    if args.counts:
        for line in counts(modules, package):
            print(line)
    if found:
        print(f"{len(found)} import-layer offence(s) ({ORDER})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
