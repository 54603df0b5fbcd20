"""The test tree's layout: shared helpers live in tests/support, nowhere else.

A helper imported from a `conftest.py` or a `test_*.py` module drags that module's fixtures and
tests into its importer (and breaks when the test module is renamed), and a benchmark importing
a test package runs that package's setup. So: nothing imports a `conftest` or `test_*` module,
scripts import only `tests.support`, and `tests.support` itself imports nothing else of tests/.
"""
from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, source: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, absolute module) for each import in `path`, relative ones resolved, `from X import Y`
    yielding both X and X.Y (Y may be a module)."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


@functools.cache
def _file_imports(path: Path) -> tuple[tuple[int, str], ...]:
    """`_imports(path)`, read once: the checks below look at scripts/ and tests/support twice."""
    return tuple(_imports(path))


def _sources(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py") if ".venv" not in p.parts)


def _is_test_module(module: str) -> bool:
    last = module.split(".")[-1]
    return module.startswith("tests.") and (last == "conftest" or last.startswith("test_"))


def test_no_module_imports_from_conftest_or_test_modules() -> None:
    bad = [f"{p.relative_to(ROOT)}:{line}: imports {m} (move the helper into tests/support)"
           for p in _sources("tests", "scripts") for line, m in _file_imports(p) if _is_test_module(m)]
    assert not bad, "\n".join(bad)


def test_scripts_import_only_tests_support() -> None:
    bad = [f"{p.relative_to(ROOT)}:{line}: imports {m} (import from tests.support instead)"
           for p in _sources("scripts") for line, m in _file_imports(p)
           if (m == "tests" or m.startswith("tests.")) and not (m == "tests.support" or m.startswith("tests.support."))]
    assert not bad, "\n".join(bad)


def test_support_imports_only_support() -> None:
    bad = [f"{p.relative_to(ROOT)}:{line}: imports {m} (tests/support must not depend on test packages)"
           for p in _sources("tests/support") for line, m in _file_imports(p)
           if m.startswith("tests.") and not m.startswith("tests.support")]
    assert not bad, "\n".join(bad)


def test_the_check_sees_every_import_form() -> None:
    """The checks above would pass vacuously if `_imports` missed relative or `from` forms."""
    source = "from .conftest import x\nfrom tests.kube import test_emulator\nimport tests.kube.conftest\n"
    found = [m for _, m in _imports(ROOT / "tests" / "kube" / "probe.py", source) if _is_test_module(m)]
    assert "tests.kube.conftest" in found
    assert "tests.kube.test_emulator" in found
    assert found.count("tests.kube.conftest") >= 2
