"""`nni-manager optuna` on the Slurm platform: a real 2-node cluster (tests/slurm fixtures), the
manager outside the jobs; each trial's agent, in its job, dials the manager's hub and offers the
study's storage to the trial on the node's loopback.

The cluster's Python (`pythonPath`) is not the manager's: a venv of the machine's /usr/bin/python3
with optuna (and grpcio) as the trials' own dependencies; the agent's dependencies are shipped
through the shared file system onto the agent's path only. The trials run under that Python.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from tests.support.optuna_study import (  # noqa: E402
    COMPLETE,
    PRUNED,
    check_study,
    check_the_killed_trial,
    copy_objectives,
    experiment_id,
    finish,
    kill_the_sleeping_trial,
    start_study,
)
from tests.support.slurm.experiments import assert_clean  # noqa: E402
from tests.support.slurm.fixtures import base, slurm  # noqa: E402,F401 (fixtures)
from tests.support.worker_python import WHEELHOUSE, optuna_bin, optuna_bin_as_root  # noqa: E402,F401 (fixtures)

def write_config(base: Path, python: Path) -> None:
    copy_objectives(base)
    ts = {"platform": "slurm", "nniManagerIp": "127.0.0.1", "trialCpuNumber": 1,
          "trialMemorySize": "200mb", "pollInterval": "0.3s", "pythonPath": str(python)}
    config = {"trialCodeDirectory": "code", "trialConcurrency": 2, "experimentWorkingDirectory": "exps",
              "agentWheelhouse": str(WHEELHOUSE), "trialGracePeriod": 2, "trainingService": ts}
    (base / "config.yml").write_text(json.dumps(config))  # JSON is YAML


def test_tpe_and_median_pruner_on_a_slurm_cluster(slurm, optuna_bin_as_root: Path, base: Path) -> None:  # noqa: F811
    """TPE + MedianPruner, 6 trials, 2 at a time (one per node): trials 0-4 COMPLETE, the 6th PRUNED
    at step 0, each with the params and values its objective saw under the cluster's Python; no job
    or process of the experiment is left."""
    write_config(base, optuna_bin_as_root / "python3")
    out = finish(start_study(base, "objectives.py:steps_in_turn", 6, "--sampler", "TPESampler",
                             "--pruner", "MedianPruner", "--direction", "minimize"))
    assert "maxTrialNumber (6) reached" in out
    trials, _ = check_study(base, optuna_bin_as_root / "python3", 6)
    assert {t.number: t.state for t in trials} == {0: COMPLETE, 1: COMPLETE, 2: COMPLETE, 3: COMPLETE,
                                                    4: COMPLETE, 5: PRUNED}
    assert next(t for t in trials if t.number == 5).last_step == 0
    assert_clean(slurm, experiment_id(base))


def test_a_trial_killed_in_its_job_ends_fail_and_counts_toward_n_trials(
        slurm, optuna_bin_as_root: Path, base: Path) -> None:  # noqa: F811
    """Optuna trial 0's process tree is SIGKILLed inside its Slurm job mid-objective: FAIL in the
    study (marked by the manager), counted toward n_trials; none RUNNING, no job left."""
    write_config(base, optuna_bin_as_root / "python3")
    proc = start_study(base, "objectives.py:first_sleeps", 4, "--sampler", "RandomSampler")
    trial_id = kill_the_sleeping_trial(base, proc)
    check_the_killed_trial(base, optuna_bin_as_root / "python3", 4, finish(proc), trial_id)
    assert_clean(slurm, experiment_id(base))
