"""nnictl's view on our experiments, and `resume --detach` pointing at the run it started."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from nni_manager.experiment_lock import nni_manager_serving
from tests.support.experiment.fixtures import BUILTIN_TUNERS, processes_under
from tests.support.webui.nni_view import LOOPBACK_JS, nnictl_start, nnictl_view, node_why_not

CLI = [sys.executable, "-m", "nni_manager"]
NNICTL = shutil.which("nnictl")


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """nni-manager with its built-in tuner: these tests are about what nnictl and the WebUI see."""
    return subprocess.run([*CLI, *args], cwd=cwd, env={**env, **BUILTIN_TUNERS}, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
@pytest.mark.skipif(NNICTL is None, reason="nnictl (pip install nni==3.0) is not installed")
def test_nnictl_view_opens_our_stopped_experiment(make_config, tmp_path: Path) -> None:
    why = node_why_not()
    if why:
        pytest.skip(why)
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    preload = home / ".nni-loopback.js"  # NNI's node manager listens on 127.0.0.1 only, as ours
    preload.write_text(LOOPBACK_JS)
    nni_env = {**env, "NODE_OPTIONS": f"--require {preload}"}
    done = _run(env, tmp_path, "run", str(make_config(maxTrialNumber=2)), "--plain", "--port", "0")
    assert done.returncode == 0, done.stderr
    exp_id = re.search(r"Experiment (\w+) stopped", done.stdout).group(1)
    port = _free_port()
    viewed = nnictl_view(nni_env, exp_id, "--port", str(port))
    try:
        assert viewed.returncode == 0 and "Traceback" not in viewed.stderr, viewed.stdout + viewed.stderr
        api = f"http://127.0.0.1:{port}/api/v1/nni"
        assert _get(api + "/check-status")["status"] == "VIEWED"  # NNI's own manager, serving our trials
        trials = _get(api + "/trial-jobs")
        assert len(trials) == 2 and {t["status"] for t in trials} == {"SUCCEEDED"}
    finally:
        subprocess.run([NNICTL, "stop", exp_id], env=nni_env, capture_output=True, timeout=120)
    listed = _run(env, tmp_path, "trials", exp_id)  # still ours too
    assert listed.stdout.count("SUCCEEDED") == 2, listed.stdout + listed.stderr


def test_resume_detach_prints_this_runs_webui(make_config, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    config = make_config(maxTrialNumber=1)
    first = _run(env, tmp_path, "run", str(config), "--detach", "--port", "0")
    assert first.returncode == 0, first.stderr
    exp_id = re.search(r"experiment (\w+) runs in the background", first.stdout).group(1)
    first_url = re.search(r"^WebUI: (\S+)$", first.stdout, re.M).group(1)
    try:
        deadline = time.monotonic() + 90
        while _get(first_url + "api/v1/nni/check-status")["status"] != "DONE":
            assert time.monotonic() < deadline
            time.sleep(0.3)
        assert _run(env, tmp_path, "stop", exp_id).returncode == 0
        again = _run(env, tmp_path, "resume", exp_id, "--detach", "--port", "0")
        assert again.returncode == 0, again.stderr
        url = re.search(r"^WebUI: (\S+)$", again.stdout, re.M).group(1)
        assert url != first_url  # this run's server (port 0: another port), not the first line of the log
        assert _get(url + "api/v1/nni/experiment")["id"] == exp_id
    finally:
        _run(env, tmp_path, "stop", exp_id)
        for proc in processes_under(tmp_path):
            proc.kill()


@pytest.mark.slow
@pytest.mark.skipif(NNICTL is None, reason="nnictl (pip install nni==3.0) is not installed")
def test_nnictl_resume_hands_over_to_nni_and_ours_is_refused_meanwhile(make_config, tmp_path: Path) -> None:
    """`nnictl resume ID` starts NNI's own manager on the NNI database we write at stop (nnictl's
    errors go to stdout and end in NNI's traceback, so it cannot be turned into a one-line refusal);
    while that manager lives, `nni-manager resume ID` is refused in one line naming it and the fix,
    and touches nothing; once `nnictl stop` ran, `nni-manager resume` works again."""
    why = node_why_not()
    if why:
        pytest.skip(why)
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    preload = home / ".nni-loopback.js"
    preload.write_text(LOOPBACK_JS)
    nni_env = {**env, "NODE_OPTIONS": f"--require {preload}"}
    done = _run(env, tmp_path, "run", str(make_config(maxTrialNumber=2)), "--plain", "--port", "0")
    assert done.returncode == 0, done.stderr
    exp_id = re.search(r"Experiment (\w+) stopped", done.stdout).group(1)
    before = _run(env, tmp_path, "trials", exp_id).stdout
    port = _free_port()
    resumed = nnictl_start(nni_env, "resume", exp_id, "--port", str(port))
    try:
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        ours = _run(env, tmp_path, "resume", exp_id, "--detach", "--port", "0")
        assert ours.returncode == 2, ours.stdout + ours.stderr
        lines = ours.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in ours.stderr, ours.stderr
        assert "NNI's own manager" in lines[0] and f"nnictl stop {exp_id}" in lines[0], lines[0]
        assert f"nni-manager resume {exp_id}" in lines[0], lines[0]
        assert _get(f"http://127.0.0.1:{port}/api/v1/nni/experiment")["id"] == exp_id  # NNI's still serves it
        foreground = _run(env, tmp_path, "resume", exp_id, "--plain", "--port", "0")  # the same without --detach
        assert foreground.returncode == 2 and len(foreground.stderr.strip().splitlines()) == 1, foreground.stderr
    finally:
        subprocess.run([NNICTL, "stop", exp_id], env=nni_env, capture_output=True, timeout=120)
    assert _run(env, tmp_path, "trials", exp_id).stdout == before  # nothing of ours was touched
    again = _run(env, tmp_path, "resume", exp_id, "--plain", "--port", "0")
    assert again.returncode == 0, again.stdout + again.stderr
    assert nni_manager_serving(tmp_path / "exps" / exp_id, exp_id) is None  # nnictl stop ended NNI's
