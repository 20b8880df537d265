"""The package's layers (README "Layout"): arrows point down only, and no import cycle.

Module-level imports only count (an import inside a function is how the public API reaches
the runtime lazily, in run() and listen()). `python -m pytest tests/test_layers.py -q` checks.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "queasy_py"

#: leaf modules every layer may import (they import only each other)
LEAF = {"errors", "defaults", "job", "validate", "options", "tracing"}
#: what each part may import at module level, besides LEAF and itself
ALLOWED = {
    "store": set(),
    "runtime": {"store"},
    "api": {"store"},  # client, queue, aio, context, __init__
    "cli": {"api", "store"},
    "spark": {"api"},  # an interface, like the cli: the public API only
    "web": {"api", "store"},  # the dashboard: the public API (and the store's mask_url)
}


def part(module: str) -> str:
    """The layer of a module named relative to the package ('store.keys', 'client')."""
    head = module.split(".")[0]
    if head in ("store", "runtime", "cli", "spark", "web"):
        return head
    return "leaf" if head in LEAF else "api"


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts) or "__init__"


def top_level_imports(path: Path) -> set[str]:
    """Package-relative names of the queasy_py modules `path` imports at module level."""
    tree = ast.parse(path.read_text())
    here = module_name(path).split(".")
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` blocks do not run
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here if is_pkg else here[:-1]
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = [*base, *(node.module.split(".") if node.module else [])]
            elif node.module and node.module.startswith("queasy_py"):
                target = node.module.split(".")[1:]
            else:
                continue
            for alias in node.names:
                candidate = ".".join([*target, alias.name])
                is_module = (PACKAGE / Path(*candidate.split("."))).with_suffix(".py").exists()
                out.add(candidate if is_module else ".".join(target) or "__init__")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("queasy_py."):
                    out.add(alias.name.split(".", 1)[1])
    out.discard("")
    return out


def graph() -> dict[str, set[str]]:
    return {
        module_name(p): top_level_imports(p)
        for p in PACKAGE.rglob("*.py")
        if "__pycache__" not in p.parts
    }


def test_arrows_point_down() -> None:
    wrong = []
    for module, imports in graph().items():
        mine = part(module)
        for target in imports:
            theirs = part(target)
            if theirs in ("leaf", mine):
                continue
            if mine == "leaf" or theirs not in ALLOWED[mine]:
                wrong.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle() -> None:
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node] & edges.keys()):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


def test_only_spark_imports_spark() -> None:
    """queasy_py.spark is an optional extra: no other module imports it at module level."""
    for module, imports in graph().items():
        if part(module) != "spark":
            assert not any(part(t) == "spark" for t in imports), (module, imports)


def test_only_web_imports_web() -> None:
    """queasy_py.web is an optional extra (starlette): the cli imports it inside a function."""
    for module, imports in graph().items():
        if part(module) != "web":
            assert not any(part(t) == "web" for t in imports), (module, imports)


def test_store_knows_nothing_above_it() -> None:
    for module, imports in graph().items():
        if part(module) == "store":
            assert all(part(t) in ("store", "leaf") for t in imports), (module, imports)
