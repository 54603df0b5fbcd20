"""The manager on "a laptop outside the cluster" (issue 18): `nni-manager run config.yml`, the command
users type, inside a network namespace of the test's own that holds only `lo`. Its only way to the
cluster is the API server on the laptop's own 127.0.0.1:<port> (as kind publishes it; here a
forwarder to the emulator's port). Pods live on the emulator's bridged network, each in a namespace
of its own, and have no route to the laptop at all: the kubeconfig names a loopback API server and
the config gives no nniManagerIp, so the hub tunnel (a relay pod + Service reached through
`pods/portforward`) is the only path. Reuse and non-reuse, on all three platforms."""
from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from nni_manager.backends.kubernetes import tunnel
from nni_manager.metrics import metric_value
from nni_manager.store import Store
from tests.support.experiment.fixtures import processes_under
from tests.support.kube.harness import IMAGE, objects_of
from tests.support.netns_forward import Laptop

NS = "default"
NNI_MANAGER = str(Path(sys.executable).parent / "nni-manager")  # the console script of this .venv
TRIALS = 2

TRIAL = textwrap.dedent("""
    import nni_agent as nni
    p = nni.get_next_parameter()
    for i in range(3):
        nni.report_intermediate_result(p["x"] * i)
    nni.report_final_result({"default": p["x"] * 10, "other": 1})
    print("trial says", p["x"], flush=True)
""")


def _role(replicas: int) -> dict[str, Any]:
    return {"replicas": replicas, "command": "python3 trial.py", "cpuNumber": 0.5, "memorySize": "256mb",
            "dockerImage": IMAGE}


def _training_service(platform: str, reuse: bool, kubeconfig: Path) -> dict[str, Any]:
    common = {"platform": platform, "kubeConfig": str(kubeconfig), "reuseMode": reuse}
    if platform == "kubernetes":
        return {**common, "dockerImage": IMAGE, "cpuNumber": 1, "memorySize": "512mb"}
    if platform == "kubeflow":
        if reuse:
            return {**common, "operator": "tf-operator", "apiVersion": "v1", "worker": _role(1)}
        return {**common, "operator": "pytorch-operator", "apiVersion": "v1", "master": _role(1)}
    return {**common, "taskRoles": [{
        "name": "worker", "taskNumber": 1, "command": "python3 trial.py", "cpuNumber": 0.5, "memorySize": "256mb",
        "gpuNumber": 0, "dockerImage": IMAGE,
        "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 1, "minSucceedTaskCount": 1}}]}


def _laptop_kubeconfig(kube: Any, path: Path, port: int) -> Path:
    """The emulator's kubeconfig, its server the laptop's own 127.0.0.1:port (kind's shape)."""
    data = yaml.safe_load(Path(kube.kubeconfig).read_text())
    for cluster in data["clusters"]:
        assert cluster["cluster"]["server"] == f"https://127.0.0.1:{kube.port}"
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(data))
    return path


def _relay_objects(kube: Any, experiment_id: str) -> dict[str, list[str]]:
    core, sel = kube.core(), f"app={tunnel.APP},expId={experiment_id}"
    return {"pods": [p.metadata.name for p in core.list_namespaced_pod(NS, label_selector=sel).items],
            "services": [s.metadata.name for s in core.list_namespaced_service(NS, label_selector=sel).items],
            "configmaps": [c.metadata.name for c in core.list_namespaced_config_map(NS, label_selector=sel).items]}


@pytest.mark.parametrize("reuse", [True, False], ids=["reuse", "non-reuse"])
@pytest.mark.parametrize("platform", ["kubernetes", "kubeflow", "frameworkcontroller"])
def test_the_manager_on_a_laptop_outside_the_cluster(kube_factory, short_dir: Path, platform: str,
                                                      reuse: bool) -> None:
    kube = kube_factory(pod_network="bridged", crd_groups=["kubeflow.org", "frameworkcontroller.microsoft.com"])
    base = short_dir
    code = base / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    with Laptop(f"laptop-{secrets.token_hex(4)}") as laptop:
        assert laptop.interfaces() == ["lo"]  # no route anywhere: only the forwarded port below
        port = laptop.forward(kube.port)
        config = base / "config.yml"
        config.write_text(yaml.safe_dump({  # no nniManagerIp: the hub tunnel is on by default
            "trialCommand": "python3 trial.py", "trialCodeDirectory": "code", "trialConcurrency": TRIALS,
            "maxTrialNumber": TRIALS, "searchSpace": {"x": {"_type": "choice", "_value": list(range(1, TRIALS + 1))}},
            "tuner": {"name": "GridSearch"}, "experimentWorkingDirectory": "exps", "trialGracePeriod": 2,
            "trainingService": _training_service(platform, reuse, _laptop_kubeconfig(kube, base / "kubeconfig", port)),
        }))
        run = subprocess.run(laptop.exec([NNI_MANAGER, "run", "--plain", "--no-webui", str(config)]), cwd=base,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        assert laptop.connections > 0  # it did talk to the cluster, through the laptop's loopback
    (exp_dir,) = (base / "exps").iterdir()
    experiment_id = exp_dir.name
    assert f"stopped: maxTrialNumber ({TRIALS}) reached" in run.stdout, run.stdout

    table = subprocess.run([NNI_MANAGER, "trials", str(exp_dir)], cwd=base, capture_output=True, text=True,
                           timeout=60)
    assert table.returncode == 0, table.stderr
    assert len(re.findall(r"SUCCEEDED", table.stdout)) == TRIALS and f"{TRIALS} succeeded" in table.stdout, table.stdout
    store = Store.open_readonly(exp_dir)
    try:
        trials, metrics = store.trials(), store.metrics()
    finally:
        store.close()
    assert sorted(t.status.value for t in trials) == ["SUCCEEDED"] * TRIALS
    finals = {}
    for t in trials:
        x = json.loads(t.form.hyper_parameters.value)["parameters"]["x"]
        got = [m for m in metrics if m["trial_id"] == t.id and m["type"] == "FINAL"]
        assert len(got) == 1, (t.id, got)  # exactly once
        finals[x] = metric_value(got[0]["data"], "test")
    assert finals == {x: {"default": 10 * x, "other": 1} for x in range(1, TRIALS + 1)}, finals

    # the trials' agents came through the relay (it ran), and it, with every object of the experiment are gone; no process is left behind
    relay = [st.get("phase") for st in kube.history("pods", NS, tunnel.relay_name(experiment_id))]
    assert "Running" in relay, relay
    empty = {"pods": [], "services": [], "configmaps": []}
    kube.wait_for(lambda: _relay_objects(kube, experiment_id) == empty, 30, what="the relay deleted")
    kube.wait_for(lambda: not any(objects_of(kube, experiment_id).values()), 30, what="the experiment's objects deleted")
    kube.wait_for(lambda: not kube.leftover_processes(), 30, what="no pod process left")
    assert processes_under(base) == []
    assert laptop.name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
