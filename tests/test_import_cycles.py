"""No import circles inside `nni_manager` or `nni_agent`.

A circle (a imports b, b imports a, directly or around several modules) hides which module is
the lower layer: it works only while the imports happen in a lucky order or inside functions,
and one moved import turns it into an ImportError. The graph is read from the source with
`ast` (nothing is imported), and counts:

- every `import` statement, at module level, inside functions and under `if TYPE_CHECKING:`
  alike: a function-level import is still a dependence, and a type-only one still ties the
  two modules together (service/ports.py's Protocols exist so that none is needed);
- `from pkg import name` as an edge to the module `pkg.name` when it is one, otherwise to `pkg`
  (its `__init__`); relative imports are resolved against the importing module's package;
- `importlib.import_module("pkg.mod")` (or `import_module(...)` imported from importlib) with a
  literal name, relative ones (`".mod", package`) too: a lazy re-export through it is still a
  dependence, only hidden from the reader.

Not seen: names computed at run time (the backend registry's entry points), which is where the
plug-in boundary is meant to be.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (ROOT / "manager" / "nni_manager", ROOT / "agent" / "nni_agent")


def _modules(packages: tuple[Path, ...]) -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for package in packages:
        for path in package.rglob("*.py"):
            parts = path.relative_to(package.parent).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def import_graph(packages: tuple[Path, ...] = PACKAGES) -> dict[str, set[str]]:
    """module -> the modules of ours (in `packages`) it imports."""
    mods = _modules(packages)

    def ours(name: str) -> str | None:  # the module itself, or its nearest package of ours
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Call) and _is_import_module(node.func):
                targets = _literal_module(node, package)
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                found = ours(target)
                if found and found != module:
                    graph[module].add(found)
    return graph


@functools.cache
def our_graph() -> dict[str, set[str]]:
    """import_graph() of nni_manager and nni_agent, read once for the tests below (not to be changed)."""
    return import_graph()


def _is_import_module(func: ast.expr) -> bool:
    """`importlib.import_module` or a bare `import_module` (from importlib import import_module)."""
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module" and isinstance(func.value, ast.Name) and func.value.id == "importlib"
    return isinstance(func, ast.Name) and func.id == "import_module"


def _literal_module(call: ast.Call, package: str) -> list[str]:
    """The module an `import_module` call names, when it is a literal (resolved when relative)."""
    if not call.args or not isinstance(call.args[0], ast.Constant) or not isinstance(call.args[0].value, str):
        return []
    name = call.args[0].value
    if not name.startswith("."):
        return [name]
    anchor_arg = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "package"), None)
    anchor = anchor_arg.value if isinstance(anchor_arg, ast.Constant) and isinstance(anchor_arg.value, str) else package
    level = len(name) - len(name.lstrip("."))
    parts = anchor.split(".")
    parts = parts[:len(parts) - (level - 1)]
    return [".".join([*parts, *([name.lstrip(".")] if name.lstrip(".") else [])])]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def describe(group: list[str], graph: dict[str, set[str]]) -> str:
    members = set(group)
    return "\n".join(f"  {m} -> {', '.join(sorted(graph[m] & members))}" for m in group)


def test_no_import_cycles() -> None:
    graph = our_graph()
    found = cycles(graph)
    assert not found, "import circles (move the shared part into a lower module, or depend on a Protocol):\n" + \
        "\n\n".join(describe(g, graph) for g in found)


def test_the_checker_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The checker itself: a circle through a relative, a function-level and a TYPE_CHECKING
    import is found, so an empty answer above means something."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from pkg.sub import c\n")
    (package / "sub" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import X\n")
    (package / "d.py").write_text("import pkg.a\n")
    graph = import_graph((package,))
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.sub.c"} and graph["pkg.sub.c"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]
    (package / "sub" / "c.py").write_text("")
    assert cycles(import_graph((package,))) == []


def test_the_checker_sees_import_module_with_a_literal_name(tmp_path: Path) -> None:
    """A lazy re-export through importlib (a package's `__getattr__` importing a submodule that
    imports the package back) is a circle like any other; a computed name is not followed."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import importlib\n"
        "def __getattr__(name):\n"
        "    return getattr(importlib.import_module('pkg.load'), name)\n")
    (package / "load.py").write_text("from pkg import low\n")
    (package / "low.py").write_text("")
    (package / "rel.py").write_text("from importlib import import_module\nimport_module('.low', 'pkg')\n")
    (package / "computed.py").write_text("import importlib\nNAME = 'pkg.load'\nimportlib.import_module(NAME)\n")
    graph = import_graph((package,))
    assert graph["pkg"] == {"pkg.load"} and graph["pkg.rel"] == {"pkg.low"} and graph["pkg.computed"] == set()
    assert cycles(graph) == []  # pkg -> pkg.load -> pkg.low: no way back yet
    (package / "low.py").write_text("from pkg import something\n")  # as a backend importing the config package
    assert cycles(import_graph((package,))) == [["pkg", "pkg.load", "pkg.low"]]


def test_the_core_sees_hybrid_mode_only_through_the_backend_contract() -> None:
    """core.py asks `Backend.mixed_pool()`, never `isinstance(backend, HybridBackend)`: composition
    is the backend's business, so the core does not import the hybrid module."""
    assert "nni_manager.service.hybrid" not in our_graph()["nni_manager.service.core"]
