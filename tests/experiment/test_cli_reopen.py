"""A DONE experiment runs on when its maxTrialNumber is raised, as under NNI 3.0: `nnictl update
trialnum` (NNI's own client, unchanged) on a `nni-manager run --detach` experiment."""
from __future__ import annotations

import asyncio
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

from nni_manager.experiment import Experiment
from nni_manager.loader import load_config
from nni_manager.webui.runner import LiveWebUI
from nni_manager.webui.sides import LiveExperiment
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


def _done_side(make_config) -> tuple[LiveWebUI, LiveExperiment, Experiment]:  # type: ignore[no-untyped-def]
    """The web side of an experiment that just ended DONE on its maxTrialNumber (not run: only
    its status and reason, as the runner leaves them)."""
    experiment = Experiment(load_config(make_config(maxTrialNumber=2)))
    experiment.status, experiment.stop_reason = "DONE", "maxTrialNumber (2) reached"
    side = LiveExperiment(experiment, "ExpReopen1", Path("."), lambda: None)
    side.phase = "RUNNING"
    return LiveWebUI(side, None), side, experiment


def test_without_keep_serving_a_raise_while_closing_runs_on_and_a_later_one_leaves_it_done(make_config) -> None:
    """`--no-keep-serving`: a maxTrialNumber raised while the run still closed makes it run on (as
    when serving); one raised after the manager decided to exit leaves it DONE with the new limit
    stored, never RUNNING in a manager that is gone."""
    web, side, experiment = _done_side(make_config)
    asyncio.run(side.update("MAX_TRIAL_NUM", {"maxTrialNumber": 4}))  # raised while the run closed
    web.finish("DONE")
    assert side.phase == "RUNNING" and web.end_without_serving() is True  # the runner runs it on

    web, side, experiment = _done_side(make_config)
    web.finish("DONE")
    assert web.end_without_serving() is False  # nothing raised: the manager exits
    asyncio.run(side.update("MAX_TRIAL_NUM", {"maxTrialNumber": 4}))  # raised during its shutdown
    assert side.phase == "DONE" and experiment.status == "DONE", (side.phase, experiment.status)
    assert experiment.config.max_trial_number == 4  # kept for a resume
