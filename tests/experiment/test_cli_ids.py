"""nnictl's habits: experiments named by id (`trials`, `logs`, `view`, `export` take an id or a
directory), `list`, `stop` and `resume` by id, and `run --detach` for a background run whose
WebUI stays until `stop`. Real `nni-manager` processes, a private HOME for NNI's manifest."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.experiment.fixtures import processes_under

CLI = [sys.executable, "-m", "nni_manager"]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    return home


def cli(home: Path, *args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HOME": str(home)})


def _status(url: str) -> str:
    with urllib.request.urlopen(url + "api/v1/nni/check-status", timeout=10) as response:
        return json.loads(response.read())["status"]


def test_detach_list_trials_logs_stop_resume_by_id(make_config, home: Path, tmp_path: Path) -> None:
    config = make_config()
    started = cli(home, "run", str(config), "--detach", "--port", "0", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    exp_id = re.search(r"experiment (\w+) runs in the background", started.stdout).group(1)
    url = re.search(r"^WebUI: (\S+)$", started.stdout, re.M).group(1)
    try:
        listed = cli(home, "list", cwd=tmp_path)
        assert listed.returncode == 0 and exp_id in listed.stdout and url.rstrip("/") in listed.stdout, listed.stdout
        deadline = time.monotonic() + 90
        while _status(url) != "DONE":
            assert time.monotonic() < deadline, "the detached experiment never finished"
            time.sleep(0.3)
        assert _status(url) == "DONE"  # finished, and still serving its WebUI: nothing to keep it but --detach

        trials = cli(home, "trials", exp_id, cwd=tmp_path)  # by id: the directory is under tmp_path/exps
        assert trials.returncode == 0 and trials.stdout.count("SUCCEEDED") == 4, trials.stdout + trials.stderr
        trial_id = re.search(r"\b([A-Za-z]\w{4})\b.*SUCCEEDED", trials.stdout).group(1)
        logs = cli(home, "logs", exp_id, trial_id, cwd=tmp_path)
        assert logs.returncode == 0 and "trial says" in logs.stdout, logs.stdout + logs.stderr
    finally:
        stopped = cli(home, "stop", exp_id, cwd=tmp_path)
        if stopped.returncode != 0:  # a failed test must not leave the background manager running
            for proc in processes_under(tmp_path):
                proc.kill()
    assert stopped.returncode == 0 and f"stopped experiment {exp_id}" in stopped.stdout, stopped.stderr
    with pytest.raises(OSError):
        _status(url)  # its WebUI is gone with it
    assert "no running experiment" in cli(home, "list", cwd=tmp_path).stdout
    # it had finished before `stop` ended its WebUI: DONE, and why (NNI's status; issue 32 item 8)
    assert re.search(rf"{exp_id}\s.*DONE.*maxTrialNumber \(4\) reached", cli(home, "list", "--all", cwd=tmp_path).stdout)
    again = cli(home, "stop", exp_id, cwd=tmp_path)
    assert again.returncode != 0 and "is not running" in again.stderr

    resumed = cli(home, "resume", exp_id, "--plain", "--no-webui", cwd=tmp_path)  # maxTrialNumber already reached
    assert resumed.returncode == 0, resumed.stderr
    assert f"Experiment {exp_id} stopped: maxTrialNumber (4) reached" in resumed.stdout
    assert cli(home, "trials", exp_id, cwd=tmp_path).stdout.count("SUCCEEDED") == 4  # the same experiment
    assert processes_under(tmp_path) == []


def test_unknown_id_says_where_it_looked(home: Path, tmp_path: Path) -> None:
    for args in (["trials", "nosuch1"], ["logs", "nosuch1", "abcde"], ["resume", "nosuch1"], ["stop", "nosuch1"]):
        out = cli(home, *args, cwd=tmp_path)
        assert out.returncode == 2 and "no experiment 'nosuch1'" in out.stderr and "Traceback" not in out.stderr, args
