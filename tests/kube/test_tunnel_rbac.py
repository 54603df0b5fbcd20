"""RBAC for the hub tunnel as the API server checks it: the tunnel's port-forward is a WebSocket
upgrade, an HTTP GET, authorized as `get` on pods/portforward, and from Kubernetes 1.35
(AuthorizePodWebsocketUpgradeCreatePermission) also as `create`. A least-privilege user holding
only `create` (the form written for SPDY clients) is named at start by `nni-manager run`, and the
Role docs/platforms/kubernetes.md ships runs an experiment through the tunnel on a 1.35 cluster."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.support.kube.rbac_user import USER_TOKEN, bind_alice, doc_role
from tests.support.kube.policy import set_policy

NS = "default"
NNI_MANAGER = str(Path(sys.executable).parent / "nni-manager")  # the console script of this .venv
TRIAL = "import nni_agent as nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'] * 10)\n"


def _run(base: Path, kubeconfig: Path) -> subprocess.CompletedProcess:
    code = base / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(TRIAL)
    config = base / "config.yml"
    config.write_text(yaml.safe_dump({  # no nniManagerIp: the hub tunnel is on by default
        "trialCommand": "python3 trial.py", "trialCodeDirectory": "code", "trialConcurrency": 1,
        "maxTrialNumber": 1, "searchSpace": {"x": {"_type": "choice", "_value": [1]}},
        "tuner": {"name": "GridSearch"}, "experimentWorkingDirectory": "exps", "trialGracePeriod": 2,
        "trainingService": {"platform": "kubernetes", "kubeConfig": str(kubeconfig), "reuseMode": False,
                            "dockerImage": "nni-test/python:3.11", "cpuNumber": 1, "memorySize": "512mb"}}))
    return subprocess.run([NNI_MANAGER, "run", "--plain", "--no-webui", str(config)], cwd=base,
                          capture_output=True, text=True, timeout=300)


def _relay_pods(kube: Any) -> list[str]:
    return [p.metadata.name for p in kube.core().list_namespaced_pod(NS).items if p.metadata.name.startswith("nni-relay-")]


def test_create_alone_on_pods_portforward_is_named_at_start(kube_factory, short_dir: Path) -> None:
    kube = kube_factory(pod_network="bridged", tokens=[f"{USER_TOKEN}=alice:rbac"])
    set_policy(kube, websocketCreateCheck=True)
    role = doc_role()
    (pf,) = [r for r in role["rules"] if r["resources"] == ["pods/portforward"]]
    pf["verbs"] = ["create"]  # what the docs shipped before: enough for SPDY's POST, not a WebSocket's GET
    run = _run(short_dir, bind_alice(kube, role))
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "cannot get pods/portforward in namespace default" in out, out
    assert "cannot create pods/portforward" not in out, out
    assert "Traceback" not in out, out
    assert not _relay_pods(kube)  # refused before the relay was made


def test_the_documented_role_runs_through_the_tunnel_on_a_1_35_cluster(kube_factory, short_dir: Path) -> None:
    kube = kube_factory(pod_network="bridged", tokens=[f"{USER_TOKEN}=alice:rbac"])
    set_policy(kube, websocketCreateCheck=True)
    run = _run(short_dir, bind_alice(kube, doc_role()))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "stopped: maxTrialNumber (1) reached" in run.stdout, run.stdout
    (exp_dir,) = (short_dir / "exps").iterdir()
    relay = [st.get("phase") for st in kube.history("pods", NS, f"nni-relay-{exp_dir.name.lower()}")]
    assert "Running" in relay, relay  # the trial's agent came through the relay
    table = subprocess.run([NNI_MANAGER, "trials", str(exp_dir)], capture_output=True, text=True, timeout=60)
    assert "1 succeeded" in table.stdout, table.stdout + table.stderr
