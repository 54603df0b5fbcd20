"""`podSpec.containers` overrides and per-role `podSpec`, through `nni-manager run`:

- `imagePullPolicy: IfNotPresent` on the trial's container (kind- or minikube-loaded images) also
  reaches the image probe's one container, instead of a second, imageless container the API
  server refuses (then nothing is shipped and the image's trials fail: the probe answers here for
  `python:3.11-slim`, which lacks the agent's dependencies).
- a TFJob role's own `podSpec` (documented in docs/platforms/kubernetes.md): the worker goes to
  the node its nodeSelector names, merged after trainingService's podSpec."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from nni_manager.backends import agent_deps
from nni_manager.store import Store
from tests.support.kube.harness import IMAGE, SLIM_IMAGE

NS = "default"
NNI_MANAGER = str(Path(sys.executable).parent / "nni-manager")  # the console script of this .venv
WHEELHOUSE = Path(__file__).resolve().parents[2] / ".venv" / "agent-wheelhouse"
TRIAL = "import nni_agent as nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'] * 10)\n"


def _run(base: Path, service: dict[str, Any], **top: Any) -> tuple[subprocess.CompletedProcess, list[tuple[str, str]]]:
    code = base / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(TRIAL)
    config = base / "config.yml"
    config.write_text(yaml.safe_dump({
        "trialCommand": "python3 trial.py", "trialCodeDirectory": "code", "trialConcurrency": 1,
        "maxTrialNumber": 1, "searchSpace": {"x": {"_type": "choice", "_value": [1]}},
        "tuner": {"name": "GridSearch"}, "experimentWorkingDirectory": "exps", "trialGracePeriod": 2,
        "nniManagerIp": "127.0.0.1", **top, "trainingService": service}))
    env = {**os.environ, agent_deps.CACHE_ENV: str(base / "wheel-cache")}  # no probe answer cached
    run = subprocess.run([NNI_MANAGER, "run", "--plain", "--no-webui", str(config)], cwd=base, env=env,
                         capture_output=True, text=True, timeout=300)
    exps = list((base / "exps").iterdir()) if (base / "exps").is_dir() else []
    if not exps:
        return run, []
    store = Store.open_readonly(exps[0])
    try:
        return run, [(t.status.value, t.message) for t in store.trials()]
    finally:
        store.close()


def test_a_container_override_reaches_the_probe(kube, short_dir: Path) -> None:
    if not any(WHEELHOUSE.glob("grpcio-*.whl")):
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    service = {"platform": "kubernetes", "kubeConfig": str(kube.kubeconfig), "reuseMode": False,
               "dockerImage": SLIM_IMAGE, "cpuNumber": 1, "memorySize": "512mb",
               "podSpec": {"containers": [{"name": "trial", "imagePullPolicy": "IfNotPresent"}]}}
    run, trials = _run(short_dir, service, agentWheelhouse=str(WHEELHOUSE))
    assert run.returncode == 0, run.stdout + run.stderr
    assert trials == [("SUCCEEDED", "")], trials
    shipped = kube.core().list_namespaced_config_map(NS, label_selector="app=nni-agent-deps").items
    assert shipped  # the probe answered: the image's dependencies were shipped
    probes = {e.involved_object.name for e in kube.core().list_namespaced_event(NS).items
              if e.reason == "Scheduled" and e.involved_object.name.startswith("nni-probe-")}
    assert probes


def test_a_role_podspec_applies_to_that_role(kube_factory, short_dir: Path) -> None:
    kube = kube_factory(nodes=["node-a=4,8192,0", "node-b=4,8192,0"], crd_groups=["kubeflow.org"])
    role = {"replicas": 1, "command": "python3 trial.py", "cpuNumber": 0.5, "memorySize": "256mb", "dockerImage": IMAGE,
            "podSpec": {"nodeSelector": {"kubernetes.io/hostname": "node-b"}}}
    service = {"platform": "kubeflow", "kubeConfig": str(kube.kubeconfig), "reuseMode": False,
               "operator": "tf-operator", "apiVersion": "v1", "worker": role,
               "podSpec": {"nodeSelector": {"kubernetes.io/hostname": "node-a"}}}  # the role's wins
    run, trials = _run(short_dir, service)
    assert run.returncode == 0, run.stdout + run.stderr
    assert trials == [("SUCCEEDED", "")], trials
    placed = {e.involved_object.name: e.message.rsplit(" to ", 1)[1] for e in kube.core().list_namespaced_event(NS).items
              if e.reason == "Scheduled" and "-worker-" in e.involved_object.name}
    assert placed and set(placed.values()) == {"node-b"}, placed
