"""NNI's own clients (nni==3.0's `nnictl` and `Experiment.connect()`) against `nni-manager run`."""
from __future__ import annotations

import json
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from nni_manager.webui import manifest

from tests.support.webui.fixtures import get_json, http, needs_nni
from tests.support.webui.experiments import RunningExperiment, nnictl

pytestmark = needs_nni


def test_nnictl_and_connect_on_a_finished_experiment(tmp_path: Path, home: Path) -> None:
    exp = RunningExperiment(tmp_path, home, "curve.py")
    try:
        exp.wait_status("DONE")  # the experiment ended; the server stays, as NNI's does
        deadline = time.monotonic() + 20  # the manifest follows the status within a second or so
        while (entry := manifest.read(home / "nni-experiments" / ".experiment")[exp.id])["status"] != "DONE":
            assert time.monotonic() < deadline, entry
            time.sleep(0.2)
        assert entry["port"] == exp.port and entry["pid"] == exp.proc.pid

        listed = nnictl(home, "experiment", "list")
        assert listed.returncode == 0 and exp.id in listed.stdout and "DONE" in listed.stdout, listed
        status = nnictl(home, "experiment", "status", exp.id)
        assert '"status":"DONE"' in status.stdout.replace(" ", ""), status
        show = nnictl(home, "experiment", "show", exp.id)
        assert exp.id in show.stdout and "webui-test" in show.stdout, show
        trials = nnictl(home, "trial", "ls", exp.id)
        assert trials.returncode == 0 and len(re.findall(r'"status": ?"SUCCEEDED"', trials.stdout)) == 4, trials
        out = tmp_path / "export.json"
        export = nnictl(home, "experiment", "export", exp.id, "--filename", str(out), "--type", "json")
        assert export.returncode == 0, export
        exported = json.loads(out.read_text())
        assert sorted(e["parameter"]["x"] for e in exported) == [1, 2, 3, 4]

        from nni.experiment import Experiment

        client = Experiment.connect(exp.port)
        assert client.id == exp.id and client.get_status() == "DONE"
        jobs = client.list_trial_jobs()
        assert sorted(j.hyperParameters[0].parameters["x"] for j in jobs) == [1, 2, 3, 4]
        assert {j.finalMetricData[0].data["default"] for j in jobs} == {1.0, 2.0, 3.0, 4.0}
        assert sorted(r.value["default"] for r in client.export_data()) == [1.0, 2.0, 3.0, 4.0]
        metrics = client.get_job_metrics()
        assert all(len(m) == 6 for m in metrics.values())  # 5 intermediate + 1 final per trial
        assert get_json(exp.api + "/job-statistics") == [{"trialJobStatus": "SUCCEEDED", "trialJobNumber": 4}]
        client.stop()  # DELETE /experiment, then waits for our pid to exit
        assert exp.proc.wait(30) == 0
        entry = manifest.read(home / "nni-experiments" / ".experiment")[exp.id]
        assert entry["status"] == "STOPPED" and "port" not in entry
        assert "stopped: maxTrialNumber (4) reached" in "".join(exp.out)
    finally:
        exp.close()


@pytest.mark.slow
def test_writes_kill_and_nnictl_stop_on_a_running_experiment(tmp_path: Path, home: Path) -> None:
    exp = RunningExperiment(tmp_path, home, "sleepy.py", trialConcurrency=1, maxTrialNumber=3)
    try:
        jobs = exp.wait_trials(lambda js: [j["status"] for j in js] == ["RUNNING"])
        assert exp.wait_status("RUNNING") == "RUNNING"
        from nni.experiment import Experiment

        client = Experiment.connect(exp.port)
        client.update_trial_concurrency(2)  # PUT /experiment?update_type=TRIAL_CONCURRENCY
        assert get_json(exp.api + "/experiment")["params"]["trialConcurrency"] == 2
        exp.wait_trials(lambda js: [j["status"] for j in js] == ["RUNNING", "RUNNING"])
        client.update_max_trial_number(2)
        killed = nnictl(home, "trial", "kill", exp.id, "--trial_id", jobs[0]["trialJobId"])
        assert killed.returncode == 0, killed
        exp.wait_trials(lambda js: js[0]["status"] == "USER_CANCELED" and len(js) == 2)
        profile = get_json(exp.api + "/experiment")
        bad = {**profile, "params": {**profile["params"], "searchSpace": {"x": {"_type": "bogus", "_value": [1]}}}}
        status, _, body = http(exp.api + "/experiment?update_type=SEARCH_SPACE", "PUT", bad)
        assert status == 500 and "bogus" in json.loads(body)["error"]
        client.update_search_space({"x": {"_type": "choice", "_value": [7, 8]}})
        assert get_json(exp.api + "/experiment")["params"]["searchSpace"] == {"x": {"_type": "choice", "_value": [7, 8]}}
        assert get_json(exp.api + "/check-status")["status"] == "NO_MORE_TRIAL"  # 2 of 2 submitted, one runs
        log = http(exp.api + f"/trial-file/{jobs[0]['trialJobId']}/stdout")
        assert log[2] == b"sleeping\n"

        # SIGTERM to the manifest's pid, then nnictl polls until that pid is gone. A user's shell reaps
        # the manager when it exits; here the test is its parent, so it reaps it while nnictl waits
        # (an unreaped zombie still "runs" for nnictl, which would wait out its whole 60 s).
        with ThreadPoolExecutor(1) as pool:
            stopping = pool.submit(nnictl, home, "stop", exp.id)
            assert exp.proc.wait(60) == 130
            stop = stopping.result()
        assert stop.returncode == 0, stop
        assert "still exists" not in stop.stdout + stop.stderr, stop  # nnictl saw the manager exit
        assert not psutil.pid_exists(exp.proc.pid) or psutil.Process(exp.proc.pid).status() == psutil.STATUS_ZOMBIE
        entry = manifest.read(home / "nni-experiments" / ".experiment")[exp.id]
        assert entry["status"] == "STOPPED"
        listed = nnictl(home, "experiment", "list", "--all")
        assert exp.id in listed.stdout and "STOPPED" in listed.stdout
    finally:
        exp.close()


def test_view_serves_a_stored_experiment_and_delete_stops_it(tmp_path: Path, home: Path) -> None:
    import subprocess

    from tests.support.webui.fixtures import CLI

    exp = RunningExperiment(tmp_path, home, "curve.py", maxTrialNumber=2)
    try:
        exp.wait_status("DONE")
        http(exp.api + "/experiment", "DELETE")
        exp.proc.wait(30)
    finally:
        exp.close()
    (exp_dir,) = (tmp_path / "exps").iterdir()
    copy = tmp_path / "copied" / exp_dir.name  # a directory copied from another machine
    copy.parent.mkdir()
    import shutil

    shutil.copytree(exp_dir, copy)
    view = subprocess.Popen([*CLI, "view", str(copy), "--port", "0"], env={**exp.env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert view.stdout is not None
        line = view.stdout.readline()
        url = re.match(r"WebUI: (\S+)", line).group(1)  # type: ignore[union-attr]
        api = url + "api/v1/nni"
        assert get_json(api + "/check-status")["status"] == "VIEWED"
        jobs = get_json(api + "/trial-jobs")
        assert len(jobs) == 2 and all(j["status"] == "SUCCEEDED" for j in jobs)
        assert http(api + f"/trial-file/{jobs[0]['trialJobId']}/stdout")[2].startswith(b"trial log line for x =")
        from nni.experiment import Experiment

        client = Experiment.connect(int(url.rsplit(":", 1)[1].strip("/")))
        assert len(client.list_trial_jobs()) == 2
        client.stop()
        assert view.wait(30) == 0
    finally:
        if view.poll() is None:
            view.send_signal(signal.SIGTERM)
            view.wait(10)
