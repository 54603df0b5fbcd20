"""Autoscaled clusters (EKS node groups at minimum 0 / Karpenter, GKE node auto-provisioning, AKS
pools at minimum 0): the GPU node a trial needs does not exist until its pod waits for it. The
emulator's cluster autoscaler (tests/support/kube/emulator/autoscaler.py) adds a node of a node
group some seconds after a pod no node holds, with `TriggeredScaleUp`, or says `NotTriggerScaleUp`
when no group's node would ever hold it. `nni-manager run`, as users type it: the trial waits with
the scheduler's and the autoscaler's words and succeeds on the new node; the hub relay stays off
the GPU pool and is safe to evict; a trial no node group fits fails at once, saying why."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from nni_manager.store import DB_NAME, Store
from tests.support.kube.policy import set_policy

NS = "default"
NNI_MANAGER = str(Path(sys.executable).parent / "nni-manager")  # the console script of this .venv
TRIAL = "import nni_agent as nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'] * 10)\n"
GPU_POOL = {"name": "gpu-pool", "cpu": 8, "memoryMi": 16384, "gpus": 1, "labels": {"pool": "gpu"}, "maxNodes": 2,
            "delay": 5.0}


def _run(base: Path, kube: Any, gpus: int) -> tuple[subprocess.CompletedProcess, Path, list[str]]:
    code = base / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(TRIAL)
    config = base / "config.yml"
    config.write_text(yaml.safe_dump({  # no nniManagerIp: the hub tunnel (a relay pod) is on
        "trialCommand": "python3 trial.py", "trialCodeDirectory": "code", "trialConcurrency": 1,
        "maxTrialNumber": 1, "searchSpace": {"x": {"_type": "choice", "_value": [1]}},
        "tuner": {"name": "GridSearch"}, "experimentWorkingDirectory": "exps", "trialGracePeriod": 2,
        "trainingService": {
            "platform": "kubernetes", "kubeConfig": str(kube.kubeconfig), "reuseMode": False,
            "dockerImage": "nni-test/python:3.11", "cpuNumber": 1, "memorySize": "512mb", "gpuNumber": gpus,
            "environmentStartTimeout": "120s",
            "podSpec": {"nodeSelector": {"pool": "gpu"},
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}}))
    proc = subprocess.Popen([NNI_MANAGER, "run", "--plain", "--no-webui", str(config)], cwd=base,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []  # the trial's message while it ran, as `nni-manager trials` and the WebUI show it
    try:
        while proc.poll() is None:
            exps = list((base / "exps").glob(f"*/{DB_NAME}")) if (base / "exps").is_dir() else []
            if exps:
                seen += [m for m in _messages(exps[0].parent) if m not in seen]
            time.sleep(0.2)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (exp_dir,) = (base / "exps").iterdir()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), exp_dir, seen


def _messages(exp_dir: Path) -> list[str]:
    try:
        store = Store.open_readonly(exp_dir)
    except Exception:  # not written yet
        return []
    try:
        return [t.message for t in store.trials() if t.message]
    except Exception:
        return []
    finally:
        store.close()


def _trial_events(exp_dir: Path) -> list[tuple[str, str]]:
    store = Store.open_readonly(exp_dir)
    try:
        (trial,) = store.trials()
        return [(s, m) for s, m, _ in store.events(trial.id)]
    finally:
        store.close()


def _scheduled_on(kube: Any, prefix: str) -> list[str]:
    """The nodes the pods named `prefix...` were assigned to (the scheduler's Scheduled events)."""
    return [e.message.rsplit(" to ", 1)[1] for e in kube.core().list_namespaced_event(NS).items
            if e.reason == "Scheduled" and e.involved_object.name.startswith(prefix)]


@pytest.mark.slow
def test_a_gpu_trial_waits_for_the_node_the_autoscaler_adds(kube_factory, short_dir: Path) -> None:
    kube = kube_factory(pod_network="bridged", nodes=["cpu-0=4,8192,0"])
    set_policy(kube, nodeGroups=[GPU_POOL])
    run, exp_dir, seen = _run(short_dir, kube, gpus=1)
    out = run.stdout + run.stderr
    assert run.returncode == 0 and "stopped: maxTrialNumber (1) reached" in run.stdout, out
    events = _trial_events(exp_dir)
    assert events[-1][0] == "SUCCEEDED", events
    waiting = " | ".join(seen)
    assert "FailedScheduling: 0/1 nodes are available" in waiting, waiting
    assert "TriggeredScaleUp: pod triggered scale-up: [{gpu-pool 0->1 (max: 2)}]" in waiting, waiting
    node_names = [n.metadata.name for n in kube.core().list_node().items]
    assert "gpu-pool-0" in node_names and "gpu-pool-1" not in node_names, node_names  # one node, for the trial
    assert _scheduled_on(kube, f"nniexp{exp_dir.name.lower()}") == ["gpu-pool-0"]
    # the relay and the image probe are not the trials': off the GPU pool, and the autoscaler may move them
    assert set(_scheduled_on(kube, "nni-relay-") + _scheduled_on(kube, "nni-probe-")) == {"cpu-0"}
    relay = [e for e in kube.core().list_namespaced_event(NS).items
             if e.reason == "Scheduled" and e.involved_object.name.startswith("nni-relay-")]
    assert relay, "no relay pod was scheduled"


def test_a_trial_no_node_group_fits_fails_at_once_saying_why(kube_factory, short_dir: Path) -> None:
    kube = kube_factory(pod_network="bridged", nodes=["cpu-0=4,8192,0"])
    set_policy(kube, nodeGroups=[GPU_POOL])
    run, exp_dir, _ = _run(short_dir, kube, gpus=4)  # the pool's nodes have 1 GPU
    events = _trial_events(exp_dir)
    status, message = events[-1]
    assert status == "FAILED", events
    assert "NotTriggerScaleUp: pod didn't trigger scale-up: 1 Insufficient nvidia.com/gpu" in message, message
    assert "FailedScheduling: 0/1 nodes are available" in message and "environmentStartTimeout" not in message, message
    assert "gpu-pool-0" not in [n.metadata.name for n in kube.core().list_node().items]
