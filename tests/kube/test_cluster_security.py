"""Clusters that enforce pod policy, as their admission answers (tests/support/kube/emulator/admission.py):
OpenShift's restricted-v2 SCC (UID and group ranges from the namespace's annotations), Pod Security
`restricted` from the namespace's label, and a compute ResourceQuota. `nni-manager run`, as users
type it: with no runAsUser / fsGroup an OpenShift project runs trials through the hub relay; the
`restricted` example of docs/platforms/kubernetes.md passes Pod Security on the plain-pods and the
FrameworkController platforms (barrier init container included) in a quota namespace; a pod the
admission refuses is one line naming it, not an RBAC hint."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from nni_manager.metrics import metric_value
from nni_manager.store import Store
from tests.support.kube.nonroot import NON_ROOT_IMAGE, non_root_image  # noqa: F401 (a fixture)
from tests.support.kube.emulator.admission import ENFORCE, GROUP_RANGE, UID_RANGE
from tests.support.kube.policy import set_policy

ROOT = Path(__file__).resolve().parents[2]
NS = "default"
NNI_MANAGER = str(Path(sys.executable).parent / "nni-manager")  # the console script of this .venv
TRIAL = ("import os, nni_agent as nni\np = nni.get_next_parameter()\n"
         "nni.report_final_result({'default': p['x'] * 10, 'uid': os.getuid()})\n")
FIRST_UID = 1000650000


def doc_restricted_pod_spec() -> dict[str, Any]:
    """The `restricted` podSpec exactly as docs/platforms/kubernetes.md ships it."""
    text = (ROOT / "docs" / "platforms" / "kubernetes.md").read_text()
    section = text[text.index("### Pod Security and OpenShift"):]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block, "no yaml block under Pod Security and OpenShift"
    return yaml.safe_load(block.group(1))["podSpec"]


def _service(platform: str, kube: Any, pod_spec: dict[str, Any] | None) -> dict[str, Any]:
    common: dict[str, Any] = {"platform": platform, "kubeConfig": str(kube.kubeconfig), "reuseMode": False,
                              "environmentStartTimeout": "60s"}
    if pod_spec is not None:
        common["podSpec"] = pod_spec
    if platform == "kubernetes":
        return {**common, "dockerImage": NON_ROOT_IMAGE, "cpuNumber": 1, "memorySize": "512mb"}
    return {**common, "taskRoles": [{
        "name": "worker", "taskNumber": 1, "command": "python3 trial.py", "cpuNumber": 0.5, "memorySize": "256mb",
        "gpuNumber": 0, "dockerImage": NON_ROOT_IMAGE,
        "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 1, "minSucceedTaskCount": 1}}]}


def _run(base: Path, service: dict[str, Any]) -> tuple[subprocess.CompletedProcess, list[tuple[str, str, Any]]]:
    """`nni-manager run` of one trial with no nniManagerIp (the hub relay is on); each trial's
    (status, message, final metric)."""
    code = base / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(TRIAL)
    config = base / "config.yml"
    config.write_text(yaml.safe_dump({
        "trialCommand": "python3 trial.py", "trialCodeDirectory": "code", "trialConcurrency": 1,
        "maxTrialNumber": 1, "searchSpace": {"x": {"_type": "choice", "_value": [1]}},
        "tuner": {"name": "GridSearch"}, "experimentWorkingDirectory": "exps", "trialGracePeriod": 2,
        "trainingService": service}))
    run = subprocess.run([NNI_MANAGER, "run", "--plain", "--no-webui", str(config)], cwd=base,
                         capture_output=True, text=True, timeout=300)
    exps = list((base / "exps").iterdir()) if (base / "exps").is_dir() else []
    if not exps:
        return run, []
    store = Store.open_readonly(exps[0])
    try:
        trials, metrics = store.trials(), store.metrics()
    finally:
        store.close()
    out = []
    for t in trials:
        final = [metric_value(m["data"], "test") for m in metrics if m["trial_id"] == t.id and m["type"] == "FINAL"]
        out.append((t.status.value, t.message, final[0] if final else None))
    return run, out


def test_an_openshift_project_runs_trials_with_the_uid_it_assigns(kube_factory, non_root_image, short_dir) -> None:  # noqa: F811
    kube = kube_factory(pod_network="bridged", images={NON_ROOT_IMAGE: non_root_image})
    set_policy(kube, scc=True)
    kube.core().patch_namespace(NS, {"metadata": {"annotations": {UID_RANGE: f"{FIRST_UID}/10000",
                                                                   GROUP_RANGE: f"{FIRST_UID}/10000"}}})
    run, trials = _run(short_dir, _service("kubernetes", kube, None))  # OpenShift users set no UID
    assert run.returncode == 0, run.stdout + run.stderr
    assert [(s, (final or {}).get("uid")) for s, _, final in trials] == [("SUCCEEDED", FIRST_UID)], trials


def test_the_documented_restricted_example_passes_pod_security(kube_factory, non_root_image, short_dir) -> None:  # noqa: F811
    kube = kube_factory(pod_network="bridged", images={NON_ROOT_IMAGE: non_root_image},
                        crd_groups=["frameworkcontroller.microsoft.com"])
    core = kube.core()
    core.patch_namespace(NS, {"metadata": {"labels": {ENFORCE: "restricted"}}})
    core.create_namespaced_resource_quota(NS, {"metadata": {"name": "compute"}, "spec": {"hard": {
        "requests.cpu": "16", "requests.memory": "32Gi", "limits.cpu": "16", "limits.memory": "32Gi"}}})
    for platform, container in (("kubernetes", "trial"), ("frameworkcontroller", "framework")):
        spec = doc_restricted_pod_spec()
        spec["containers"][0]["name"] = container
        base = short_dir / platform
        base.mkdir()
        run, trials = _run(base, _service(platform, kube, spec))
        assert run.returncode == 0, run.stdout + run.stderr
        assert [(s, (final or {}).get("uid")) for s, _, final in trials] == [("SUCCEEDED", 1000)], (platform, trials)


def test_a_pod_security_refusal_is_not_called_rbac(kube_factory, non_root_image, short_dir) -> None:  # noqa: F811
    kube = kube_factory(pod_network="bridged", images={NON_ROOT_IMAGE: non_root_image})
    kube.core().patch_namespace(NS, {"metadata": {"labels": {ENFORCE: "restricted"}}})
    run, trials = _run(short_dir, _service("kubernetes", kube, {"securityContext": {"runAsUser": 1000}}))
    out = run.stdout + run.stderr
    assert "Traceback" not in out, out
    messages = " ".join(m for _, m, _ in trials) + out
    assert "Pod Security admission refuses the pod (403)" in messages, messages
    assert 'violates PodSecurity "restricted:latest"' in messages and "RBAC" not in messages, messages
    assert [s for s, _, _ in trials] in ([], ["FAILED"]), trials
