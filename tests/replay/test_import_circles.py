"""No import circles between the slime modules or the importers: a lazy import inside a function
counts too (what both sides need lives in the lower module)."""

from __future__ import annotations

import ast
from pathlib import Path

from ..conftest import REPO

#: folders of the repository and the package names they are imported under
PACKAGES = {"rltrace": "rltrace", "replay": "rltrace.replay", "profiling": "rltrace.profiling", "ui": "rltrace.ui"}
WATCHED = ("rltrace.replay.slime", "rltrace.importers", "rltrace.store.imports")


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if folder == "rltrace" and parts[0] in PACKAGES:
                continue  # the links to the top-level folders
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every rltrace module `name` imports, at the top or inside a function."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                head = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(head + ([node.module] if node.module else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    return {m for m in found if m in modules and m != name}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_slime_modules_and_the_importers_import_no_circle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert "rltrace.replay.slime_trace" in graph and "rltrace.importers.metrics" in graph
    assert "rltrace.replay.slime_trace" not in graph["rltrace.replay.slime_trace"]
    circles = [c for c in _circles(graph) if any(m.startswith(WATCHED) for m in c)]
    assert circles == []
