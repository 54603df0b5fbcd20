"""Small trial scripts (stdlib `nni_agent` API) and config writers for experiment tests."""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

TRIALS = {
    # reports 3 intermediate results and the final one: x (or x + y) as the metric
    "quick.py": """
        import nni_agent as nni
        p = nni.get_next_parameter()
        for i in range(3):
            nni.report_intermediate_result(p["x"] * i)
        nni.report_final_result({"default": p["x"], "other": 1})
        print("trial says", p["x"])
    """,
    "multiphase.py": """
        import nni_agent as nni
        first = nni.get_next_parameter()
        second = nni.get_next_parameter()
        nni.report_final_result(first["x"] + second["x"])
    """,
    "sleepy.py": """
        import time
        import nni_agent as nni
        p = nni.get_next_parameter()
        nni.report_intermediate_result(0)
        print("sleeping", flush=True)
        time.sleep(120)
    """,
}


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    for name, body in TRIALS.items():
        (code / name).write_text(textwrap.dedent(body))
    return code


@pytest.fixture
def make_config(tmp_path: Path, code_dir: Path):
    """Write a config YAML next to the code; keyword arguments override top-level fields."""

    def make(script: str = "quick.py", **overrides: Any) -> Path:
        config: dict[str, Any] = {
            "trialCommand": f"python {script}",
            "trialCodeDirectory": "code",
            "trialConcurrency": 2,
            "maxTrialNumber": 4,
            "searchSpace": {"x": {"_type": "choice", "_value": [1, 2, 3, 4]}},
            "tuner": {"name": "GridSearch"},
            "trainingService": {"platform": "local"},
            "experimentWorkingDirectory": "exps",
            "trialGracePeriod": 1,
        }
        config.update(overrides)
        path = tmp_path / "config.yml"
        path.write_text(yaml.safe_dump(config))
        return path

    return make


# The manager's in-process Random / GridSearch (nni_manager/dispatcher/__init__.py) for tests whose
# subject is not the tuner: NNI's dispatcher process imports nni (seconds, tens on a busy host) and
# takes up to 3 s to exit (its command queue's poll); tests/experiment/test_nni_dispatcher.py and
# the tests that run NNI's algorithms keep covering it.
BUILTIN_TUNERS = {"NNI_MANAGER_BUILTIN_TUNERS": "1"}


def processes_under(root: Path) -> list[psutil.Process]:
    """Live processes whose working directory is inside `root` (trials run in their code dir)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and Path(proc.cwd()).is_relative_to(root):
                found.append(proc)
        except psutil.Error:
            pass
    return found
