"""The `system` marker: on every test that uses a process fixture, in a system folder or in the
explicit list; `pytest -m "not system"` keeps at least 300 tests (the inner loop)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.system_marker import (REPORT_ENV, SYSTEM_DIRS, SYSTEM_FIXTURES, SYSTEM_TESTS,
                                         MarkerInfo, holds_the_whole_suite, is_system, marker_report)

ROOT = Path(__file__).resolve().parents[1]


def test_a_process_fixture_a_system_folder_or_a_listed_test_makes_a_system_test() -> None:
    assert is_system("tests/manager/test_x.py::test_y", ["tmp_path", "kube_factory"])
    assert is_system("tests/kube/test_x.py::test_y[a-b]", ["pai"])
    assert is_system("tests/slurm/test_new.py::test_anything", [])
    assert is_system("tests/test_boot.py::test_whatever[3.8]", [])
    assert is_system("tests/security/test_shell_values.py::test_python_path_in_the_probe_runs_nothing", [])
    assert not is_system("tests/security/test_shell_values.py::test_slurm_names_are_refused[x]", ["tmp_path"])
    assert not is_system("tests/manager/test_jobs.py::test_y", ["tmp_path", "monkeypatch"])
    assert not is_system("tests/test_bootstrap_words.py::test_y", [])  # a prefix of a listed module is not it


def test_every_test_using_a_process_fixture_is_marked_system(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    # In the full suite (scripts/test.sh) the session's own collection is the list; a selection that
    # passed for the whole suite would fail `stale` and the inner-loop count below.
    if holds_the_whole_suite(request.session, ROOT / "tests"):
        items = marker_report(request.session.items)
    else:  # run alone or with a selection: collect the whole suite
        report = tmp_path / "markers.json"
        # --assert=plain: collecting runs no assert, so rewriting every test module's asserts (half the
        # collection's CPU where bytecode is not cached) would be wasted.
        r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                            "--assert=plain", "-p", "tests.support.system_marker", "tests"], cwd=ROOT,
                           capture_output=True, text=True, env={**os.environ, REPORT_ENV: str(report)}, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        items: dict[str, MarkerInfo] = json.loads(report.read_text())
    unmarked = [n for n, i in items.items() if SYSTEM_FIXTURES.intersection(i["fixtures"]) and not i["system"]]
    assert unmarked == []
    in_dirs = [n for n, i in items.items() if n.split("/")[1] in SYSTEM_DIRS and not i["system"]]
    assert in_dirs == []
    stale = [t for t in SYSTEM_TESTS if not any(n.removeprefix("tests/").split("[")[0] == t
                                                or n.removeprefix("tests/").startswith(t + "::") for n in items)]
    assert stale == [], "entries of SYSTEM_TESTS that name no test any more"
    inner = [n for n, i in items.items() if not i["system"]]
    assert len(inner) >= 300, f"the inner loop (`-m 'not system'`) has only {len(inner)} tests"
    assert any(i["system"] for i in items.values())


def test_the_audit_fails_an_unmarked_test_that_starts_a_process(tmp_path: Path) -> None:
    """`-p tests.support.system_audit`: a test outside every system rule that runs a process fails,
    naming itself and where to mark it; a marked one runs."""
    (tmp_path / "test_sneaky.py").write_text(
        "import subprocess, sys\nimport pytest\n\n"
        "def test_sneaky():\n    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n\n"
        "@pytest.mark.system\ndef test_marked():\n    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.support.system_audit",
                        "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path / "test_sneaky.py")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert "1 failed, 1 passed" in out, out[-3000:]
    assert "test_sneaky is not marked `system` but starts a process" in out, out[-3000:]


@pytest.mark.slow
def test_the_inner_loop_starts_no_process(tmp_path: Path) -> None:
    """The whole inner loop under the audit: every test `-m "not system"` selects runs without
    starting a process or a server (a new test that does fails here, naming where to mark it)."""
    # --assert=plain: the audit judges what the tests start, not their assert messages (a failing test
    # still fails the run); rewriting every module's asserts would cost half the collection's CPU.
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not system",
                        "--assert=plain", "-p", "tests.support.system_audit", "-n", "0", "--basetemp", str(tmp_path / "t"), "tests"],
                       cwd=ROOT, capture_output=True, text=True, timeout=1200)
    out = r.stdout + r.stderr
    unmarked = sorted({line.split("StartedProcess: ", 1)[1].split(" is not marked", 1)[0]
                       for line in out.splitlines() if "StartedProcess: " in line and " is not marked" in line})
    assert unmarked == [], f"{len(unmarked)} unmarked tests start a process or a server:\n" + "\n".join(unmarked)
    assert r.returncode == 0, out[-3000:]
