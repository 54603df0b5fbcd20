"""`nni-manager optuna` on `platform: kubernetes`, with the real optuna package and a SQLite study.

The manager runs on "a laptop outside the cluster" (a network namespace of the test's own holding
only `lo`, the API server forwarded to its loopback, no nniManagerIp: the hub tunnel); the pods live
on the emulator's bridged pod network, each in a network namespace of its own, with no route to
the manager or its storage except their agent's link. The image stands for `python:3.11-slim` plus
`pip install optuna grpcio protobuf` (tests/support/worker_python.py): not NNI (the manager ships
the agent, off the trial's path) nor psutil. Each launched trial runs one Optuna trial of an
unmodified objective (objectives.py; pods see the host's files, so each records what it saw in
the test's own directory); the study afterwards holds exactly n_trials finished trials whose
params and values are those each objective saw and returned (tests/support/optuna_study.py).
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

optuna = pytest.importorskip("optuna")

from nni_manager.backends import agent_deps  # noqa: E402
from nni_manager.types import TrialJobStatus  # noqa: E402
from tests.support.experiment.fixtures import processes_under  # noqa: E402
from tests.support.kube.fixtures import kube_factory  # noqa: E402, F401 (fixture)
from tests.support.kube.harness import objects_of  # noqa: E402
from tests.support.netns_forward import Laptop  # noqa: E402
from tests.support.optuna_study import (  # noqa: E402
    COMPLETE,
    FAIL,
    PRUNED,
    check_study,
    copy_objectives,
    experiment_id,
    experiment_trials,
    finish,
    storage_url,
    worker_records,
)
from tests.support.worker_python import make_worker_python  # noqa: E402

NNI_MANAGER = str(Path(sys.executable).parent / "nni-manager")  # the console script of this .venv
# filled by scripts/test.sh (scripts/fill_wheelhouse.py): the agent's dependencies for the image's Python
WHEELHOUSE = Path(__file__).resolve().parents[2] / ".venv" / "agent-wheelhouse"
IMAGE = "nni-test/optuna:3.11"
NS = "default"


@pytest.fixture
def study_dir(short_dir: Path) -> Path:
    if not any(WHEELHOUSE.glob("psutil-*.whl")):
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    copy_objectives(short_dir)
    return short_dir


def _cluster(kube_factory: Any, where: Path) -> tuple[Any, Path]:  # noqa: F811 (the fixture's value)
    """An emulator on the bridged pod network whose IMAGE is a Python with optuna; that python3."""
    (where / "image").mkdir()
    image = make_worker_python(where / "image", ["optuna", "grpcio", "protobuf"])
    return kube_factory(pod_network="bridged", images={IMAGE: str(image)}), image / "python3"


def _config(kube: Any, where: Path, port: int, concurrency: int) -> None:
    kubeconfig = yaml.safe_load(Path(kube.kubeconfig).read_text())
    for cluster in kubeconfig["clusters"]:  # the laptop's own 127.0.0.1:port (kind's shape)
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    (where / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    (where / "config.yml").write_text(yaml.safe_dump({  # no nniManagerIp: the hub tunnel, the only way in
        "trialCodeDirectory": "code", "trialConcurrency": concurrency, "experimentWorkingDirectory": "exps",
        "trialGracePeriod": 2, "agentWheelhouse": str(WHEELHOUSE),
        "trainingService": {"platform": "kubernetes", "kubeConfig": str(where / "kubeconfig"),
                            "dockerImage": IMAGE, "cpuNumber": 1, "memorySize": "512mb",
                            "environmentStartTimeout": "120s"}}))


def _start(laptop: Laptop, where: Path, target: str, n_trials: int, *extra: str) -> subprocess.Popen[str]:
    """`nni-manager optuna` on the laptop (no probe answer or wheel cached by other tests)."""
    return subprocess.Popen(laptop.exec([
        NNI_MANAGER, "optuna", target, "--study-name", "s", "--storage", storage_url(where),
        "--n-trials", str(n_trials), "--config", str(where / "config.yml"), "--plain", "--no-webui", *extra]),
        cwd=where, env={**os.environ, agent_deps.CACHE_ENV: str(where / "wheel-cache")},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _check_pods(where: Path, records: dict[str, dict]) -> None:
    """Each runner came from the trial API's own directory (the image has no NNI), alone on the
    trial's PYTHONPATH, and spoke to its agent on the pod's own loopback."""
    for record in records.values():
        assert [Path(p).name[:11] for p in record["environ"]["PYTHONPATH"].split(os.pathsep)] == [".trial-api-"]
        assert record["storage_at"] == record["endpoint"]


def _all_gone(kube: Any, where: Path) -> None:
    kube.wait_for(lambda: not any(objects_of(kube, experiment_id(where), NS).values()), 30,
                  what="the experiment's objects deleted")
    kube.wait_for(lambda: not kube.leftover_processes(), 30, what="no pod process left")
    assert processes_under(where) == []


@pytest.mark.slow
def test_tpe_and_median_pruner_on_pods_through_the_tunnel(kube_factory, study_dir: Path) -> None:  # noqa: F811
    kube, python = _cluster(kube_factory, study_dir)
    with Laptop(f"laptop-{secrets.token_hex(4)}") as laptop:
        _config(kube, study_dir, laptop.forward(kube.port), concurrency=2)
        out = finish(_start(laptop, study_dir, "objectives.py:steps_in_turn", 6,
                            "--sampler", "TPESampler", "--pruner", "MedianPruner"), timeout=400)
        assert laptop.connections > 0  # the manager reached the cluster through the laptop's loopback only
    assert "maxTrialNumber (6) reached" in out, out
    trials, records = check_study(study_dir, python, 6)
    assert {t.number: t.state for t in trials} == {**{n: COMPLETE for n in range(5)}, 5: PRUNED}
    assert [t.last_step for t in sorted(trials, key=lambda t: t.number)] == [2, 2, 2, 2, 2, 0]  # pruned at step 0
    _check_pods(study_dir, records)
    _all_gone(kube, study_dir)


def _pod_of(kube: Any, pid: int) -> str:
    for pod in kube.core().list_namespaced_pod(NS).items:
        if pid in kube.pod_processes(NS, pod.metadata.name):
            return pod.metadata.name
    raise AssertionError(f"no pod runs pid {pid}")


@pytest.mark.slow
def test_a_pod_deleted_mid_trial_leaves_its_optuna_trial_fail(kube_factory, study_dir: Path) -> None:  # noqa: F811
    """The pod running Optuna trial 0 is deleted while its objective sleeps: that trial ends FAIL in
    the study (never RUNNING), the others COMPLETE, and n_trials counts it (docs/optuna.md)."""
    kube, python = _cluster(kube_factory, study_dir)
    with Laptop(f"laptop-{secrets.token_hex(4)}") as laptop:
        _config(kube, study_dir, laptop.forward(kube.port), concurrency=2)
        manager = _start(laptop, study_dir, "objectives.py:first_sleeps", 4)
        try:
            deadline = time.monotonic() + 300
            while not (hung := [r for r in worker_records(study_dir).values() if r["number"] == 0]):
                assert manager.poll() is None and time.monotonic() < deadline, "Optuna trial 0 never ran"
                time.sleep(0.2)
            kube.core().delete_namespaced_pod(_pod_of(kube, hung[0]["pid"]), NS)
        finally:
            out = finish(manager, timeout=400)
    assert "maxTrialNumber (4) reached" in out, out
    trials, records = check_study(study_dir, python, 4)
    assert {t.number: t.state for t in trials} == {0: FAIL, 1: COMPLETE, 2: COMPLETE, 3: COMPLETE}
    killed = next(t.user_attrs["nni:trial_id"] for t in trials if t.number == 0)
    status = experiment_trials(study_dir)[0][killed]
    assert status.is_terminal and status != TrialJobStatus.SUCCEEDED, status
    _check_pods(study_dir, records)
    _all_gone(kube, study_dir)
