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
# The sidecar's rooms (docs/architecture.md), lowest first: a room imports only rooms below it;
# the loop (``sidecar``) wires the parts.
WATCH_ROOMS = [
    ["progress", "processes", "timelines"],
    ["cluster"],
    ["silence"],
    ["parts"],
    ["sidecar", "__init__"],
]
WATCH_LEVEL = {name: level for level, names in enumerate(WATCH_ROOMS) for name in names}
MODULES_PER_FOLDER = 10  # a folder with more is split into rooms of its own


def dotted_imports(path: Path) -> set[str]:
    """The modules one module imports, wherever in it (``from a.b import c``: ``a.b``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def imports(path: Path) -> set[str]:
    """The areal_watchdog packages one module imports, wherever in it."""
    return {n.split(".")[1] for n in dotted_imports(path) if n.startswith("areal_watchdog.")}


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
    for path in sorted((PACKAGE / "watch").rglob("*.py")):
        text = path.read_text()
        assert "launch" not in imports(path), path.name
        assert "scancel" not in text and "SLURM_" not in text, path.name


def test_no_watch_room_imports_one_above_or_beside_it() -> None:
    watch = PACKAGE / "watch"
    upward = []
    for path in sorted(watch.rglob("*.py")):
        parts = path.relative_to(watch).parts
        source = parts[0] if len(parts) > 1 else path.stem
        assert source in WATCH_LEVEL, f"watch/{source}: a new room needs its place in WATCH_ROOMS"
        rooms = {
            n.split(".")[2] for n in dotted_imports(path) if n.startswith("areal_watchdog.watch.")
        }
        upward += [f"{path.relative_to(REPO)} imports watch/{room}" for room in rooms - {source}
                   if WATCH_LEVEL[room] >= WATCH_LEVEL[source]]  # fmt: skip
    assert upward == []


def test_no_folder_holds_more_than_ten_modules() -> None:
    """A newcomer can tell where a change belongs: a folder past ten modules is split into rooms,
    each with a docstring that says what belongs there."""
    crowded = {}
    for folder in sorted({p.parent for p in PACKAGE.rglob("*.py")}):
        modules = list(folder.glob("*.py"))
        if len(modules) > MODULES_PER_FOLDER:
            crowded[str(folder.relative_to(REPO))] = len(modules)
        assert (folder / "__init__.py").exists(), folder
        assert ast.get_docstring(ast.parse((folder / "__init__.py").read_text())), folder
    assert crowded == {}


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
