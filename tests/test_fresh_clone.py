"""A fresh clone that is not beside ``shared/`` (no published schemas): the whole suite is collected,
and the tests that need the schemas are skipped naming the reason instead of failing."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.schemas import SCHEMAS_ENV

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.system  # runs pytest itself in a subprocess


def _clone_without_schemas(tmp_path: Path) -> Path:
    """The project's tests and settings in a folder with no ``shared/`` above it."""
    repo = tmp_path / "nni-agent"
    repo.mkdir()
    shutil.copytree(ROOT / "tests", repo / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", repo / "pyproject.toml")
    assert not any((p / "shared" / "schemas").exists() for p in repo.parents)
    return repo


def _pytest(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != SCHEMAS_ENV}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_whole_suite_is_collected_without_the_schemas(tmp_path: Path) -> None:
    r = _pytest(_clone_without_schemas(tmp_path), "--collect-only")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "error" not in r.stdout.splitlines()[-1], r.stdout[-3000:]
    assert "tests/kube/test_operators.py::test_published_examples_are_valid" in r.stdout


def test_the_tests_needing_the_schemas_skip_naming_them(tmp_path: Path) -> None:
    r = _pytest(_clone_without_schemas(tmp_path), "-rs", "tests/kube/test_operators.py",
                "-k", "published_examples or located_outside or missing_gives or wrong_type")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "1 passed, 3 skipped" in out, out[-3000:]  # the wrong-$NNI_SHARED_SCHEMAS error still runs
    assert "published schemas (shared/schemas) not found" in out and SCHEMAS_ENV in out, out[-3000:]
