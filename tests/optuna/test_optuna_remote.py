"""`nni-manager optuna` on the remote platform: a real sshd worker in its own network namespace,
whose only route to the manager (and so to the study's storage) is the SSH link.

The worker's Python is not the manager's: a venv of the machine's /usr/bin/python3 with optuna
(and grpcio, which Optuna's storage proxy needs) as the trial's own dependencies; the agent's
are shipped by the manager onto the agent's path only. Each objective records what it saw on
the worker (objectives.py); the study afterwards holds exactly n_trials finished trials whose
params and values are those.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from tests.support.optuna_study import (  # noqa: E402
    COMPLETE,
    PRUNED,
    check_study,
    check_the_killed_trial,
    copy_objectives,
    finish,
    kill_the_sleeping_trial,
    start_study,
)
from tests.support.remote.fixtures import (  # noqa: E402,F401 (fixtures)
    SshdHost,
    netns_hosts,
    ssh_keys,
    ssh_user,
)
from tests.support.worker_python import WHEELHOUSE, optuna_bin  # noqa: E402,F401 (fixtures)

pytestmark = pytest.mark.ssh
def write_config(where: Path, host: SshdHost, python_dir: Path, concurrency: int) -> Path:
    copy_objectives(where)
    where.chmod(0o755)  # the objectives, run by the SSH user, write what they saw to where/seen
    (where / "seen").mkdir()
    shutil.chown(where / "seen", host.machine.user)
    m = host.machine
    machine = {"host": m.host, "port": m.port, "user": m.user, "sshKeyFile": str(m.ssh_key_file),
               "knownHostsFile": str(m.known_hosts_file), "proxyCommand": m.proxy_command,
               "pythonPath": str(python_dir)}
    config = {"trialCodeDirectory": "code", "trialConcurrency": concurrency, "experimentWorkingDirectory": "exps",
              "agentWheelhouse": str(WHEELHOUSE),
              "trainingService": {"platform": "remote", "machineList": [machine]}}
    (where / "config.yml").write_text(json.dumps(config))  # JSON is YAML
    return where / "config.yml"


def test_tpe_and_median_pruner_on_a_remote_worker(netns_hosts, optuna_bin, short_dir: Path) -> None:  # noqa: F811
    """TPE + MedianPruner, 6 trials, 2 at a time, on a worker that reaches the manager only through
    SSH: trials 0-4 COMPLETE, the 6th PRUNED at step 0 (each waits for the earlier ones to finish,
    so the pruner sees the same history however the two interleave)."""
    no_route = subprocess.run(["ip", "netns", "exec", netns_hosts[0].name, str(optuna_bin / "python3"), "-c",
                               "import optuna, grpc; import socket; socket.create_connection(('127.0.0.1', 1), 2)"],
                              capture_output=True, text=True)
    assert "ConnectionRefusedError" in no_route.stderr  # optuna imports there; its loopback is its own
    write_config(short_dir, netns_hosts[0], optuna_bin, concurrency=2)
    out = finish(start_study(short_dir, "objectives.py:steps_in_turn", 6, "--sampler", "TPESampler",
                             "--pruner", "MedianPruner", "--direction", "minimize"))
    assert "maxTrialNumber (6) reached" in out
    trials, _ = check_study(short_dir, optuna_bin / "python3", 6)
    assert {t.number: t.state for t in trials} == {0: COMPLETE, 1: COMPLETE, 2: COMPLETE, 3: COMPLETE,
                                                    4: COMPLETE, 5: PRUNED}
    assert next(t for t in trials if t.number == 5).last_step == 0


def test_a_trial_killed_on_the_worker_ends_fail_and_counts_toward_n_trials(
        netns_hosts, optuna_bin, short_dir: Path) -> None:  # noqa: F811
    """Optuna trial 0's process tree is SIGKILLed on the worker mid-objective: it cannot tell the
    study, so the manager marks it FAIL when its trial ends; it counts as one of the n_trials
    finished trials (as `study.optimize(n_trials=N)`, or MaxTrialsCallback(N, states=None), counts
    FAIL), the study ends with 4 finished and none RUNNING."""
    write_config(short_dir, netns_hosts[0], optuna_bin, concurrency=2)
    proc = start_study(short_dir, "objectives.py:first_sleeps", 4, "--sampler", "RandomSampler")
    trial_id = kill_the_sleeping_trial(short_dir, proc)
    check_the_killed_trial(short_dir, optuna_bin / "python3", 4, finish(proc), trial_id)
