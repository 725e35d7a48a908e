"""The layers of docs/architecture.md, checked: a package imports only packages below it (at
module level; an import inside a function is a cycle held apart, and counts too), and the
sidecar knows no backend."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "areal_watchdog"
# Lowest first; packages on one line sit side by side and never import each other.
LAYERS = [
    ["common"],
    ["config"],
    ["rundir"],
    ["evidence", "trajectory"],
    ["rank", "diagnose"],
    ["report"],
    ["notify", "metrics"],
    ["watch", "launch"],
    ["recover"],
    ["doctor", "workflow_check"],
    ["cli", "__init__"],
]
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}


def imports(path: Path) -> set[str]:
    """The areal_watchdog packages one module imports, wherever in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        found |= {n.split(".")[1] for n in names if n.startswith("areal_watchdog.")}
    return found


def package_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else path.stem


def test_no_package_imports_one_above_or_beside_it() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = package_of(path)
        assert source in LEVEL, f"{source}: a new package needs its place in LAYERS"
        for target in imports(path) - {source}:
            if LEVEL[target] >= LEVEL[source]:
                upward.append(f"{path.relative_to(REPO)} imports {target}")
    assert upward == []


def test_the_sidecar_knows_no_backend() -> None:
    """The sidecar acts on a scheduler only through the command the backend recorded."""
    for path in sorted((PACKAGE / "watch").glob("*.py")):
        text = path.read_text()
        assert "launch" not in imports(path), path.name
        assert "scancel" not in text and "SLURM_" not in text, path.name


def test_no_module_cycle_even_through_imports_inside_functions() -> None:
    modules = {
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
        for p in PACKAGE.rglob("*.py")
    }
    edges = {name: module_imports(path, modules) - {name} for name, path in modules.items()}
    cycles = []
    for start in edges:  # every module reachable back to itself is in a cycle
        seen, todo = set(), list(edges[start])
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += edges[name]
        if start in seen:
            cycles.append(start)
    assert cycles == []


def module_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ours one module imports (``from a.b import c`` may name module a.b.c)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return found & modules.keys()


def test_every_file_a_recipe_names_exists() -> None:
    """docs/architecture.md's "Where a change belongs": each path a recipe names in backticks
    (a module under ``areal_watchdog/``, a test, a fixture folder, a doc) is there, so a
    recipe cannot name a module that was split or renamed."""
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text.split("## Where a change belongs", 1)[1].split("\n## ", 1)[0]
    named = {
        token.split(" ")[0].rstrip("/").split("*")[0].rstrip("/")
        for token in re.findall(r"`([^`]+)`", table)
        if re.fullmatch(r"[\w./*-]+(/|\.py|\.json|\.md)?", token.split(" ")[0]) and "/" in token
    }
    roots = (REPO, REPO / "areal_watchdog", REPO / "docs")
    missing = [p for p in sorted(named) if not any((root / p).exists() for root in roots)]
    assert len(named) > 15 and not missing, missing
