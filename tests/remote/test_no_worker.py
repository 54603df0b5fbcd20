"""A run whose only worker cannot start is a failure: NNI's ERROR status over the REST API, a
non-zero exit status (3), and the reason as the last line, never exit 0.

The worker is a network namespace with no route anywhere, and its Python (the machine's own,
in a venv) lacks the agent's dependencies: pip cannot fetch them, as behind a firewall."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from nni_manager.cli import EXIT_NO_WORKER

pytestmark = pytest.mark.ssh
CLI = [sys.executable, "-m", "nni_manager"]


def _status(api: str) -> str:
    with urllib.request.urlopen(api + "/check-status", timeout=5) as response:
        return json.loads(response.read())["status"]


def test_only_worker_cannot_start_exits_3_with_the_reason_and_rest_says_error(netns_hosts, worker_dir: Path,
                                                                               tmp_path: Path) -> None:
    if not Path("/usr/bin/python3").exists():
        pytest.skip("no /usr/bin/python3 on this machine")
    bare = worker_dir / "bare"  # the SSH user runs it
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(bare)], check=True)  # no grpcio, no pip
    for shipped in netns_hosts[2].home.glob(".nni-agent/*/deps-*"):  # an earlier test's: they would make it usable
        shutil.rmtree(shipped, ignore_errors=True)
    host = netns_hosts[2].machine
    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text("print('never runs')\n")
    config = {
        "trialCommand": "python3 trial.py", "trialCodeDirectory": str(code), "trialConcurrency": 1,
        "maxTrialNumber": 2, "searchSpace": {"x": {"_type": "choice", "_value": [1, 2]}},
        "tuner": {"name": "GridSearch"}, "experimentWorkingDirectory": str(tmp_path / "exps"),
        "trainingService": {"platform": "remote", "machineList": [{
            "host": host.host, "port": host.port, "user": host.user, "sshKeyFile": str(host.ssh_key_file),
            "knownHostsFile": str(host.known_hosts_file), "proxyCommand": host.proxy_command,
            "pythonPath": str(bare / "bin")}]},
    }
    (tmp_path / "config.yml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([*CLI, "run", "--plain", "--keep-serving", "--port", "0", "config.yml"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = ""
        for line in proc.stdout:  # the WebUI line comes first; the run goes on meanwhile
            if line.startswith("WebUI: "):
                url = line.split()[1]
                break
        assert url, proc.stderr.read() if proc.stderr else ""
        api = url + "api/v1/nni"
        deadline = time.monotonic() + 120
        while (status := _status(api)) != "ERROR":
            assert status not in ("DONE", "STOPPED"), f"the experiment ended {status}, not ERROR"
            assert time.monotonic() < deadline, f"status stayed {status}"
            time.sleep(0.2)
        with urllib.request.urlopen(api + "/check-status", timeout=5) as response:
            errors = json.loads(response.read())["errors"]
        assert any("agent's dependencies" in e or "dependenc" in e for e in errors), errors
        for line in proc.stdout:  # it keeps serving the WebUI after the end, as NNI does
            if "the WebUI stays" in line:
                break
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == EXIT_NO_WORKER, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("nni-manager: no machine is usable") and "dependenc" in last, err


def test_run_help_documents_the_exit_statuses() -> None:
    out = subprocess.run([*CLI, "run", "--help"], capture_output=True, text=True, check=True).stdout
    for code, words in ((0, "done"), (1, "tuner"), (2, "config"), (EXIT_NO_WORKER, "no worker could start"),
                        (130, "stopped by the user")):
        assert any(line.split()[:1] == [str(code)] and words in line for line in out.splitlines()), (code, out)
