"""`nni-manager run / trials / logs` as subprocesses, including Ctrl-C."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.experiment.fixtures import processes_under

CLI = [sys.executable, "-m", "nni_manager"]


def cli(*args: str, cwd: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_run_then_trials_and_logs(make_config, tmp_path: Path) -> None:
    config = make_config()
    run = cli("run", str(config), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "stopped: maxTrialNumber (4) reached" in run.stdout
    assert re.search(r"Best trial \(maximize\): \w{5}  metric 4  parameters x=4", run.stdout)
    (exp_dir,) = (tmp_path / "exps").iterdir()
    assert f"Results: {exp_dir}" in run.stdout

    table = cli("trials", str(exp_dir), cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    ids = re.findall(r"│ (\w{5}) +│ \d │ SUCCEEDED", table.stdout)
    assert len(ids) == 4 and "4 succeeded" in table.stdout

    logs = cli("logs", str(exp_dir), ids[0], cwd=tmp_path)
    assert logs.returncode == 0 and re.fullmatch(r"trial says \d\n", logs.stdout), logs
    follow = cli("logs", str(exp_dir), ids[0], "--stderr", "--follow", cwd=tmp_path, timeout=20)
    assert follow.returncode == 0 and follow.stdout == ""
    missing = cli("logs", str(exp_dir), "nope1", cwd=tmp_path)
    assert missing.returncode == 2 and "nope1" in missing.stderr and "Traceback" not in missing.stderr


def test_config_error_exits_2_without_traceback(make_config, tmp_path: Path) -> None:
    config = make_config(trialConcurency=3)
    result = cli("run", str(config), cwd=tmp_path)
    assert result.returncode == 2
    assert "trialConcurency" in result.stderr and "did you mean `trialConcurrency`?" in result.stderr
    assert "Traceback" not in result.stderr


def test_help_for_each_command(tmp_path: Path) -> None:
    for command in ("run", "trials", "logs"):
        result = cli(command, "--help", cwd=tmp_path)
        assert result.returncode == 0 and f"nni-manager {command}" in result.stdout


def test_ctrl_c_cancels_trials_and_leaves_none(make_config, tmp_path: Path, code_dir: Path) -> None:
    config = make_config("sleepy.py", maxTrialNumber=2)
    proc = subprocess.Popen([*CLI, "run", "--plain", str(config)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while len([p for p in processes_under(code_dir) if "sleepy.py" in p.cmdline()]) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "trials never started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=40)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "stopped: interrupted" in out and "2 user_canceled" in out
    assert "Traceback" not in err
    assert processes_under(tmp_path) == []  # trials, the agent, the dispatcher: none holds the pipes or lives on


def test_dry_run_prints_the_objects_and_starts_nothing(tmp_path: Path) -> None:
    import yaml

    config = tmp_path / "tf.yml"
    kubeconfig = tmp_path / "kubeconfig"  # run needs one, so --dry-run checks it too (read only by run)
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    config.write_text(yaml.safe_dump({
        "trialConcurrency": 2, "experimentWorkingDirectory": str(tmp_path / "exps"),
        "searchSpace": {"x": {"_type": "choice", "_value": [1]}}, "tuner": {"name": "Random"},  # as run needs
        "trainingService": {
            "platform": "kubeflow", "operator": "tf-operator", "apiVersion": "v1", "nniManagerIp": "127.0.0.9",
            "kubeConfig": str(kubeconfig),
            "worker": {"replicas": 2, "command": "python3 train.py", "cpuNumber": 1, "memorySize": "2gb",
                       "gpuNumber": 1, "dockerImage": "msranni/nni:latest"},
            "ps": {"replicas": 1, "command": "python3 ps.py", "cpuNumber": 1, "memorySize": 1024},
        }}))
    run = cli("run", str(config), "--dry-run", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    *shared, secret, job = yaml.safe_load_all(run.stdout)
    assert [o["kind"] for o in shared] == ["ConfigMap"]  # the agent's boot step and wheel, once per experiment
    name = job["metadata"]["name"]
    assert secret["kind"] == "Secret" and set(secret["stringData"]) == {  # one token per replica's agent
        f"{name}-worker-0", f"{name}-worker-1", f"{name}-ps-0", "ca.crt"}
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]
    container = worker["template"]["spec"]["containers"][0]
    assert job["kind"] == "TFJob" and worker["replicas"] == 2 and container["name"] == "tensorflow"
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "2048Mi", "nvidia.com/gpu": "1"}
    assert "127.0.0.9:<hubPort>" in container["command"] and "--ca-file" in container["command"]
    assert not (tmp_path / "exps").exists()  # nothing was started


def test_commands_that_serve_nothing_never_import_the_web_server(tmp_path: Path) -> None:
    """`list`, `trials`, `logs`, `stop` read the manifest and the store: aiohttp's import (a fifth of a
    second, its TLS contexts loading the system's CA bundle) belongs to `run` and `view` only."""
    probe = ("import sys; from nni_manager.cli import main\n"
             "for argv in (['list', '--all'], ['trials', 'nope1'], ['stop', 'nope1']):\n"
             "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'aiohttp'"
             " or m == 'nni_manager.webui.server'))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]", done.stdout
