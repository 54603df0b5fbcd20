"""A DONE experiment runs on when its maxTrialNumber is raised, as under NNI 3.0: `nnictl update
trialnum` (NNI's own client, unchanged) on a `nni-manager run --detach` experiment."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.experiment.fixtures import processes_under

CLI = [sys.executable, "-m", "nni_manager"]
NNICTL = shutil.which("nnictl")


def _status(url: str) -> str:
    with urllib.request.urlopen(url + "api/v1/nni/check-status", timeout=10) as response:
        return json.loads(response.read())["status"]


def _wait_status(url: str, want: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while _status(url) != want:
        assert time.monotonic() < deadline, f"never {want}: {_status(url)}"
        time.sleep(0.3)


@pytest.mark.skipif(NNICTL is None, reason="nnictl (pip install nni==3.0) is not installed")
def test_nnictl_update_trialnum_reopens_a_done_experiment(make_config, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    config = make_config(maxTrialNumber=2, searchSpace={"x": {"_type": "choice", "_value": [1, 2, 3, 4]}})
    started = subprocess.run([*CLI, "run", str(config), "--detach", "--port", "0"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    exp_id = re.search(r"experiment (\w+) runs in the background", started.stdout).group(1)
    url = re.search(r"^WebUI: (\S+)$", started.stdout, re.M).group(1)
    try:
        _wait_status(url, "DONE")
        updated = subprocess.run([NNICTL, "update", "trialnum", exp_id, "--value", "4"], env=env, capture_output=True,
                                 text=True, timeout=60)
        assert updated.returncode == 0 and "Update trialnum success" in updated.stdout, \
            updated.stdout + updated.stderr
        _wait_status(url, "DONE")
        trials = subprocess.run([*CLI, "trials", exp_id], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=60)
        assert trials.stdout.count("SUCCEEDED") == 4, trials.stdout
        with urllib.request.urlopen(url + "api/v1/nni/experiment", timeout=10) as response:
            assert json.loads(response.read())["params"]["maxTrialNumber"] == 4
    finally:
        subprocess.run([*CLI, "stop", exp_id], cwd=tmp_path, env=env, capture_output=True, timeout=120)
        for proc in processes_under(tmp_path):
            proc.kill()
