"""`gravityocr bench layering`: every import that runs against the layering, and every cycle
between rooms, in the installed package's source (function-level imports included).

The layers, each importing only those before it:
    metrics  <-  network  <-  decode  <-  engine  <-  recognizer  <-  pipelines  <-  serve
and beside them (importing any layer, imported by none): evaluation, then corpus, then training,
each importing only those beside rooms before it; bench and the command line on top of all.
`recognizer` is pipelines/recognizer.py, the one door to the engine.

Prints one line per wrong arrow (`importer -> imported`) and one per cycle of modules, nothing
when there is none; exit 1 if there is any (tests/test_layering.py keeps both at zero).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

DISTRIBUTION = ("gravityocr", "gravityocr.model", "gravityocr.model.network", "gravityocr.model.decode",
                "gravityocr.model.engine", "gravityocr.model.training", "gravityocr.model.evaluation",
                "gravityocr.pipelines", "gravityocr.serve", "gravityocr.bench", "gravityocr.corpus")
CHAIN = ("metrics", "network", "decode", "engine", "recognizer", "pipelines", "serve")
BESIDE = ("evaluation", "corpus", "training")
TOP = ("bench", "cli")
PACKAGES = {  # module name prefix -> room (longest prefix wins)
    "gravityocr.metrics": "metrics",
    "gravityocr.model.network": "network",
    "gravityocr.model.decode": "decode",
    "gravityocr.model.engine": "engine",
    "gravityocr.pipelines.recognizer": "recognizer",
    "gravityocr.pipelines": "pipelines",
    "gravityocr.serve": "serve",
    "gravityocr.corpus": "corpus",
    "gravityocr.model.evaluation": "evaluation",
    "gravityocr.model.training": "training",
    "gravityocr.bench": "bench",
    "gravityocr.cli": "cli",
    "gravityocr.model": "network",  # the package's __init__ and model/default's loading path
    "gravityocr": "cli",
}


def room_of(module: str) -> str:
    best = max((prefix for prefix in PACKAGES if module == prefix or module.startswith(prefix + ".")), key=len)
    return PACKAGES[best]


def allowed(importer: str, imported: str) -> bool:
    if importer == imported or importer in TOP:
        return True
    if imported in TOP:
        return False
    if importer in CHAIN:
        return imported in CHAIN and CHAIN.index(imported) < CHAIN.index(importer)
    # beside rooms: any layer, and the beside rooms before them
    return imported in CHAIN or BESIDE.index(imported) < BESIDE.index(importer)


def source_modules() -> dict[str, Path]:
    """Installed module name -> source file, for every module of the distribution's packages."""
    import importlib.util

    modules = {}
    for package in DISTRIBUTION:
        spec = importlib.util.find_spec(package)
        for location in spec.submodule_search_locations:
            for path in Path(location).glob("*.py"):
                modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The distribution's modules that `module` imports, anywhere in its file: `from p import
    name` counts as p.name where that is a module, else as p."""
    found = set()
    package = module if path.stem == "__init__" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                         for alias in node.names)
    return {name for name in found if name in modules and name != module}


def import_graph() -> dict[str, set[str]]:
    modules = source_modules()
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def wrong_arrows(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((module, imported) for module, imports in graph.items() for imported in imports
                  if not allowed(room_of(module), room_of(imported)))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a loop (Tarjan's strongly
    connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="gravityocr bench layering", description=__doc__.splitlines()[0]).parse_args(argv)
    graph = import_graph()
    arrows, loops = wrong_arrows(graph), cycles(graph)
    for importer, imported in arrows:
        print(f"{importer} ({room_of(importer)}) -> {imported} ({room_of(imported)})")
    for group in loops:
        print("cycle: " + " <-> ".join(group))
    return 1 if arrows or loops else 0


if __name__ == "__main__":
    sys.exit(main())
