"""What a trial finds on its path when the agent runs from private paths (nni_agent/trial_path.py):
the worker's own PYTHONPATH, after a directory holding only the stdlib trial API."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from nni_agent import trial_path

STOCK = Path("/usr/bin/python3")


def test_trial_gets_the_workers_path_and_only_the_trial_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trial_path, "BOOT_PATHS", [])
    monkeypatch.setattr(trial_path, "_made", [])
    assert trial_path.trial_pythonpath(tmp_path, "/the/workers") == "/the/workers"  # no private paths: unchanged
    assert trial_path.trial_pythonpath(tmp_path, None) is None
    monkeypatch.setattr(trial_path, "BOOT_PATHS", ["/agent/lib", "/agent/deps"])
    got = trial_path.trial_pythonpath(tmp_path, "/the/workers")
    assert got is not None
    api, workers = got.split(":")
    assert workers == "/the/workers" and Path(api).parent == tmp_path
    assert sorted(p.relative_to(api).as_posix() for p in Path(api).rglob("*")) == [
        "nni_agent", "nni_agent/__init__.py", "nni_agent/study_runner.py", "nni_agent/study_storage.py",
        "nni_agent/trial_api.py"]  # and an Optuna study's runner, run under the worker's Python
    assert trial_path.trial_pythonpath(tmp_path, None) == api  # made once per agent
    if not STOCK.exists():
        pytest.skip("no /usr/bin/python3 to import it with a bare Python")
    out = subprocess.run([str(STOCK), "-I", "-c", f"import sys; sys.path.insert(0, {api!r}); import nni_agent as nni; "
                          "print(nni.get_next_parameter(), 'grpc' in sys.modules)"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "False"  # the trial API pulls in none of the agent's dependencies
