"""Istio sidecar injection (issue 30, Part 2 item 8): the emulator's mutating webhook (sidecar.py)
adds an `istio-proxy` container to pods of a namespace labelled `istio-injection=enabled` unless
they opt out with `sidecar.istio.io/inject: "false"`; the proxy runs until the pod is deleted, so a
pod whose own containers ended stays Running. The hub relay pod must carry the config's
podAnnotations, or a user cannot opt it out."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from nni_manager.backends.kubernetes import tunnel
from tests.support.kube.harness import IMAGE
from tests.support.kube.pods import pod_body

NS = "default"
NNI_MANAGER = str(Path(sys.executable).parent / "nni-manager")  # the console script of this .venv
TRIAL = "import nni_agent as nni\np = nni.get_next_parameter()\nnni.report_final_result(p['x'] * 10)\n"
OPT_OUT = {"sidecar.istio.io/inject": "false"}


def _label_for_injection(kube) -> None:
    kube.core().patch_namespace(NS, {"metadata": {"labels": {"istio-injection": "enabled"}}})


def test_the_injector_adds_a_proxy_that_keeps_the_pod_running(kube_factory) -> None:
    kube = kube_factory(sidecar_image=IMAGE)
    v1 = kube.core()
    v1.create_namespaced_pod(NS, pod_body("before", "true"))  # the namespace is not labelled yet
    _label_for_injection(kube)
    v1.create_namespaced_pod(NS, pod_body("meshed", "true"))
    optout = pod_body("optout", "true")
    optout["metadata"]["annotations"] = dict(OPT_OUT)
    v1.create_namespaced_pod(NS, optout)
    names = {p: [c.name for c in v1.read_namespaced_pod(p, NS).spec.containers] for p in ("before", "meshed", "optout")}
    assert names == {"before": ["main"], "meshed": ["main", "istio-proxy"], "optout": ["main"]}, names
    assert "sidecar.istio.io/status" in v1.read_namespaced_pod("meshed", NS).metadata.annotations
    kube.wait_for(lambda: v1.read_namespaced_pod("optout", NS).status.phase == "Succeeded", 30, what="optout done")
    meshed = kube.wait_for(lambda: (lambda p: p if any(s.state.terminated for s in p.status.container_statuses or [])
                                    else None)(v1.read_namespaced_pod("meshed", NS)), 30, what="main ended")
    assert meshed.status.phase == "Running"  # the proxy keeps it up: what a relay that ended would look like
    for p in ("before", "meshed", "optout"):
        v1.delete_namespaced_pod(p, NS, grace_period_seconds=0)


def test_the_relay_pod_carries_the_configs_pod_annotations() -> None:
    _, pod, _ = tunnel.relay_objects("exp1", NS, IMAGE, "0" * 64, annotations=OPT_OUT)
    assert pod["metadata"]["annotations"] == {**tunnel.SAFE_TO_EVICT, **OPT_OUT}


def test_an_opted_out_experiment_runs_without_sidecars_in_a_meshed_namespace(kube_factory, short_dir: Path) -> None:
    kube = kube_factory(pod_network="bridged", sidecar_image=IMAGE)
    _label_for_injection(kube)
    base = short_dir
    (base / "code").mkdir()
    (base / "code" / "trial.py").write_text(TRIAL)
    config = base / "config.yml"
    config.write_text(yaml.safe_dump({  # no nniManagerIp: the hub tunnel and its relay pod
        "trialCommand": "python3 trial.py", "trialCodeDirectory": "code", "trialConcurrency": 1,
        "maxTrialNumber": 1, "searchSpace": {"x": {"_type": "choice", "_value": [1]}},
        "tuner": {"name": "GridSearch"}, "experimentWorkingDirectory": "exps", "trialGracePeriod": 2,
        "trainingService": {"platform": "kubernetes", "kubeConfig": str(kube.kubeconfig), "reuseMode": False,
                            "dockerImage": IMAGE, "cpuNumber": 0.5, "memorySize": "256mb",
                            "podAnnotations": OPT_OUT}}))
    run = subprocess.run([NNI_MANAGER, "run", "--plain", "--no-webui", str(config)], cwd=base,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "stopped: maxTrialNumber (1) reached" in run.stdout, run.stdout + run.stderr
    (exp_dir,) = (base / "exps").iterdir()
    relay = tunnel.relay_name(exp_dir.name)
    created = kube.history("pods", NS, relay)
    assert created, "no relay pod"
    # the relay got no proxy: its statuses name only its own container
    assert {c["name"] for st in created for c in st.get("containerStatuses") or []} == {"relay"}, created
