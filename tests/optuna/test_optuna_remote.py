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
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from nni_manager.store import Store  # noqa: E402
from nni_manager.types import TrialJobStatus  # noqa: E402
from tests.support.remote.fixtures import (  # noqa: E402,F401 (fixtures)
    SshdHost,
    leave_home_as_found,
    netns_hosts,
    processes_with,
    ssh_keys,
)
from tests.support.worker_python import make_worker_python  # noqa: E402

pytestmark = pytest.mark.ssh
CLI = [sys.executable, "-m", "nni_manager"]
HERE = Path(__file__).parent
# filled by scripts/test.sh (scripts/fill_wheelhouse.py): the agent's dependencies for the worker's Python
WHEELHOUSE = Path(__file__).resolve().parents[2] / ".venv" / "agent-wheelhouse"
COMPLETE, PRUNED, FAIL = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
                          optuna.trial.TrialState.FAIL)


@pytest.fixture(scope="module")
def optuna_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The worker's Python with optuna (its bin directory: the machine's pythonPath)."""
    if not (WHEELHOUSE / ".complete").exists():
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    root = tmp_path_factory.mktemp("optpy")
    yield make_worker_python(root, ["optuna", "grpcio", "protobuf"])
    shutil.rmtree(root, ignore_errors=True)


def write_config(where: Path, host: SshdHost, python_dir: Path, concurrency: int) -> Path:
    code = where / "code"
    code.mkdir()
    shutil.copy(HERE / "objectives.py", code / "objectives.py")
    m = host.machine
    machine = {"host": m.host, "port": m.port, "user": m.user, "sshKeyFile": str(m.ssh_key_file),
               "knownHostsFile": str(m.known_hosts_file), "proxyCommand": m.proxy_command,
               "pythonPath": str(python_dir)}
    config = {"trialCodeDirectory": "code", "trialConcurrency": concurrency, "experimentWorkingDirectory": "exps",
              "agentWheelhouse": str(WHEELHOUSE),
              "trainingService": {"platform": "remote", "machineList": [machine]}}
    (where / "config.yml").write_text(json.dumps(config))  # JSON is YAML
    (where / "db").mkdir()
    return where / "config.yml"


def start_study(where: Path, target: str, n_trials: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, "optuna", target, "--study-name", "s", "--storage", storage_url(where),
                             "--n-trials", str(n_trials), "--config", str(where / "config.yml"), "--plain",
                             "--no-webui", *extra], cwd=where, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def storage_url(where: Path) -> str:
    return f"sqlite:///{where / 'db' / 'study.db'}"


def finish(proc: subprocess.Popen[str], timeout: float = 300) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        raise AssertionError("the study did not end:\n" + out) from None
    assert proc.returncode == 0, out
    return out


def experiment_id(where: Path) -> str:
    (exp_dir,) = (where / "exps").iterdir()
    return exp_dir.name


def worker_records(where: Path) -> dict[str, dict]:
    """What each objective wrote on the worker: seen/<trial id>.json next to its objectives.py,
    in the trial's code directory under the SSH user's ~/nni-experiments."""
    exp_id = experiment_id(where)
    return {p.stem: json.loads(p.read_text())
            for p in (Path.home() / "nni-experiments" / exp_id).rglob("seen/*.json")}


def experiment_trials(where: Path) -> tuple[dict[str, TrialJobStatus], dict[str, dict]]:
    """Each trial's status here, and the final metric it reported (what `trials` and the WebUI show)."""
    store = Store.open_readonly(where / "exps" / experiment_id(where))
    try:
        statuses = {t.id: t.status for t in store.trials()}
        finals = {m["trial_id"]: json.loads(json.loads(m["data"])["value"]) for m in store.metrics()
                  if m["type"] == "FINAL"}
        return statuses, finals
    finally:
        store.close()


def check_study(where: Path, python_dir: Path, n_trials: int) -> tuple[list, dict[str, dict]]:
    """Exactly n_trials finished Optuna trials, none RUNNING, each one NNI trial's, with the params its
    objective saw (on the worker, under the worker's Python, through the agent only) and the values
    it returned."""
    trials = optuna.load_study(study_name="s", storage=storage_url(where)).get_trials(deepcopy=False)
    assert len(trials) == n_trials and all(t.state.is_finished() for t in trials), [t.state for t in trials]
    records = worker_records(where)
    statuses, finals = experiment_trials(where)
    assert len(records) == len(statuses) == n_trials
    for t in trials:
        trial_id = t.system_attrs["nni:trial_id"]
        record = records[trial_id]
        assert record["number"] == t.number and record["params"] == t.params
        assert record["python"] == str(python_dir / "python3")  # the worker's Python, not the manager's
        assert record["storage_class"] == "AgentStorageProxy" and record["endpoint"].startswith("127.0.0.1:")
        assert record["wrong_token"] == "UNAUTHENTICATED" and "NNI_STUDY_STORAGE_TOKEN" not in record["environ"]
        assert "study.db" not in json.dumps([record["environ"], record["argv"]])
        if t.state == COMPLETE:
            assert record["returned"] == t.values and finals[trial_id]["default"] == t.values[0]
            assert statuses[trial_id] == TrialJobStatus.SUCCEEDED
        elif t.state == PRUNED:
            assert record["pruned_at"] == t.last_step and trial_id not in finals
            assert statuses[trial_id] == TrialJobStatus.EARLY_STOPPED
    return trials, records


def test_tpe_and_median_pruner_on_a_remote_worker(netns_hosts, optuna_python, short_dir: Path) -> None:  # noqa: F811
    """TPE + MedianPruner, 6 trials, 2 at a time, on a worker that reaches the manager only through
    SSH: trials 0-4 COMPLETE, the 6th PRUNED at step 0 (each waits for the earlier ones to finish,
    so the pruner sees the same history however the two interleave)."""
    no_route = subprocess.run(["ip", "netns", "exec", netns_hosts[0].name, str(optuna_python / "python3"), "-c",
                               "import optuna, grpc; import socket; socket.create_connection(('127.0.0.1', 1), 2)"],
                              capture_output=True, text=True)
    assert "ConnectionRefusedError" in no_route.stderr  # optuna imports there; its loopback is its own
    write_config(short_dir, netns_hosts[0], optuna_python, concurrency=2)
    out = finish(start_study(short_dir, "objectives.py:steps_in_turn", 6, "--sampler", "TPESampler",
                             "--pruner", "MedianPruner", "--direction", "minimize"))
    assert "maxTrialNumber (6) reached" in out
    trials, _ = check_study(short_dir, optuna_python, 6)
    assert {t.number: t.state for t in trials} == {0: COMPLETE, 1: COMPLETE, 2: COMPLETE, 3: COMPLETE,
                                                    4: COMPLETE, 5: PRUNED}
    assert next(t for t in trials if t.number == 5).last_step == 0


def test_a_trial_killed_on_the_worker_ends_fail_and_counts_toward_n_trials(
        netns_hosts, optuna_python, short_dir: Path) -> None:  # noqa: F811
    """Optuna trial 0's process tree is SIGKILLed on the worker mid-objective: it cannot tell the
    study, so the manager marks it FAIL when its trial ends; it counts as one of the n_trials
    finished trials (as `study.optimize(n_trials=N)`, or MaxTrialsCallback(N, states=None), counts
    FAIL), the study ends with 4 finished and none RUNNING."""
    write_config(short_dir, netns_hosts[0], optuna_python, concurrency=2)
    proc = start_study(short_dir, "objectives.py:first_sleeps", 4, "--sampler", "RandomSampler")
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "trial 0 never started"
            if (short_dir / "exps").is_dir() and any((short_dir / "exps").iterdir()):
                sleeping = [r for r in worker_records(short_dir).values() if r.get("slept")]
                if sleeping:
                    break
            time.sleep(0.3)
        (record,) = sleeping
        trial_id = record["environ"]["NNI_TRIAL_JOB_ID"]
        tree = processes_with(f"NNI_TRIAL_JOB_ID={trial_id}".encode())
        assert record["pid"] in tree
        for pid in tree:
            os.kill(pid, signal.SIGKILL)
        out = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "maxTrialNumber (4) reached" in out
    trials, _ = check_study(short_dir, optuna_python, 4)
    killed = next(t for t in trials if t.system_attrs["nni:trial_id"] == trial_id)
    assert killed.number == 0 and killed.state == FAIL
    assert [t.state for t in trials if t is not killed] == [COMPLETE] * 3
    statuses, _ = experiment_trials(short_dir)
    assert statuses[trial_id] == TrialJobStatus.FAILED
    log = (short_dir / "exps" / experiment_id(short_dir) / "log" / "nnimanager.log").read_text()
    assert log.count("was left RUNNING: marked FAIL") == 1
    assert not processes_with(f"NNI_EXP_ID={experiment_id(short_dir)}".encode())  # nothing left on the worker
