"""Count the uses of `typing.Any` as a type in nni_manager and nni_agent (issue 34: halve them).

A use is counted from the syntax tree (`ast`), so comments, docstrings and other strings do not
count; the rule:

- every `Any` name that refers to `typing.Any` (imported from `typing` or `typing_extensions`,
  possibly `as` another name), and every `typing.Any` attribute; the import itself is not a use;
- a string annotation (`x: "dict[str, Any]"`, `cast("Any", v)`) is parsed and its `Any`s count;
- an alias does not hide one: a module-level assignment whose value is a type expression that
  mentions `Any` (`Json = Any`, `Row: TypeAlias = dict[str, Any]`, or through another such alias)
  makes the alias's name an `Any` use wherever it is read, in its own module and in every module
  that imports it (`from .jsontypes import Json`, `import x.y as z; z.Json`); its definition counts
  as the grep's did. TypedDicts and Protocols are classes, not aliases: their uses do not count.

`python scripts/count_any.py` prints the total and the files with the most uses;
tests/test_any_budget.py keeps the total under its cap.
"""
from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (ROOT / "manager" / "nni_manager", ROOT / "agent" / "nni_agent")
TYPING = ("typing", "typing_extensions")


def _modules(packages: tuple[Path, ...]) -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for package in packages:
        for path in sorted(package.rglob("*.py")):
            parts = path.relative_to(package.parent).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names, relative ones resolved against `module`."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class _Module:
    """One module's names: which refer to typing.Any, to `typing`, to our modules, to our aliases."""

    def __init__(self, name: str, path: Path, is_package: bool) -> None:
        self.name = name
        self.path = path
        self.tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        self.any_names: set[str] = set()  # local names bound to typing.Any
        self.typing_names: set[str] = set()  # local names bound to the typing module
        self.module_names: dict[str, str] = {}  # local name -> our module it is bound to
        self.imported: dict[str, tuple[str, str]] = {}  # local name -> (module, name) imported from
        self.alias_values: dict[str, ast.expr] = {}  # module-level `X = <type expression>`
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(name, is_package, node)
                for alias in node.names:
                    local = alias.asname or alias.name
                    if source in TYPING and alias.name == "Any":
                        self.any_names.add(local)
                    else:
                        self.imported[local] = (source, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in TYPING:
                        self.typing_names.add(alias.asname or alias.name)
                    elif alias.asname:
                        self.module_names[alias.asname] = alias.name
        for stmt in self.tree.body:
            target, value = None, None
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target, value = stmt.targets[0], stmt.value
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                target, value = stmt.target, stmt.value
            if isinstance(target, ast.Name) and value is not None and _type_expression(value):
                self.alias_values[target.id] = value


def _type_expression(value: ast.expr) -> bool:
    """Whether an assigned value reads as a type: names, attributes, subscripts, `|` unions."""
    if isinstance(value, (ast.Name, ast.Attribute, ast.Subscript)):
        return True
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitOr):
        return _type_expression(value.left) and _type_expression(value.right)
    return False


class AnyCounter:
    """Counts per module; aliases are resolved lazily (an alias may point at another module's)."""

    def __init__(self, packages: tuple[Path, ...] = PACKAGES) -> None:
        paths = _modules(packages)
        self.modules = {
            name: _Module(name, path, path.name == "__init__.py") for name, path in paths.items()
        }
        self._alias_memo: dict[tuple[str, str], bool] = {}

    def is_any_alias(self, module: str, name: str, seen: frozenset[tuple[str, str]] = frozenset()) -> bool:
        """Whether `name`, read in `module`, is a type alias that mentions typing.Any."""
        key = (module, name)
        if key in seen or module not in self.modules:
            return False
        if key in self._alias_memo:
            return self._alias_memo[key]
        mod = self.modules[module]
        result = False
        if name in mod.alias_values:
            result = self._mentions_any(mod, mod.alias_values[name], seen | {key})
        elif name in mod.imported:
            source, original = mod.imported[name]
            result = self.is_any_alias(source, original, seen | {key})
        self._alias_memo[key] = result
        return result

    def _mentions_any(self, mod: _Module, expr: ast.expr, seen: frozenset[tuple[str, str]]) -> bool:
        return any(self._use(mod, node, seen) for node in ast.walk(expr))

    def _use(self, mod: _Module, node: ast.AST, seen: frozenset[tuple[str, str]] = frozenset()) -> bool:
        """Whether this one node is a use of Any (directly or through an alias)."""
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            return node.id in mod.any_names or (
                node.id not in mod.any_names and self.is_any_alias(mod.name, node.id, seen)
            )
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in mod.typing_names:
                return node.attr == "Any"
            target = mod.module_names.get(node.value.id) or (
                ".".join(mod.imported[node.value.id]) if node.value.id in mod.imported else None
            )
            return target is not None and self.is_any_alias(target, node.attr, seen)
        return False

    def count(self, module: str) -> int:
        mod = self.modules[module]
        total = 0
        for node in ast.walk(mod.tree):
            if self._use(mod, node):
                total += 1
            for text in _string_annotations(node):
                try:
                    parsed = ast.parse(text, mode="eval")
                except SyntaxError:
                    continue
                total += sum(1 for sub in ast.walk(parsed) if self._use(mod, sub))
        return total

    def counts(self) -> dict[Path, int]:
        return {mod.path: self.count(name) for name, mod in self.modules.items()}


def _string_annotations(node: ast.AST) -> list[str]:
    """String constants in annotation position, and a string first argument of `cast(...)`."""
    annotations: list[ast.expr | None] = []
    if isinstance(node, ast.arg):
        annotations.append(node.annotation)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        annotations.append(node.returns)
    elif isinstance(node, ast.AnnAssign):
        annotations.append(node.annotation)
    elif isinstance(node, ast.Call) and node.args and (
        (isinstance(node.func, ast.Name) and node.func.id == "cast")
        or (isinstance(node.func, ast.Attribute) and node.func.attr == "cast")
    ):
        annotations.append(node.args[0])
    texts = []
    for annotation in annotations:
        if annotation is None:
            continue
        for sub in ast.walk(annotation):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                texts.append(sub.value)
    return texts


def count_any(packages: tuple[Path, ...] = PACKAGES) -> tuple[int, dict[Path, int]]:
    """(total, per file) uses of Any under the rule above."""
    per_file = AnyCounter(packages).counts()
    return sum(per_file.values()), per_file


def main(argv: list[str]) -> int:
    top = int(argv[0]) if argv else 20
    total, per_file = count_any()
    print(f"{total} uses of Any in nni_manager and nni_agent")
    for path, n in Counter({p: n for p, n in per_file.items() if n}).most_common(top):
        print(f"{n:5d}  {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
