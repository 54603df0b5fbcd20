"""What restricted and tainted clusters need from the pods, on real runs in the emulator (issue 18):
an image running as a non-root user reads its token (mode 0444, no fsGroup), `podSpec` / `podAnnotations` on
kubeflow and frameworkcontroller (tolerations, securityContext, the Istio sidecar annotation), and
NNI v1's FrameworkController `configPath` template (NNI's own mnist-pytorch example)."""
from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.kube.harness import code_dir, config, ours, pod_json, pods_service
from tests.support.manager.helpers import form, until, wait_status
from tests.support.kube.nonroot import NON_ROOT_IMAGE, non_root_image  # noqa: F401 (a fixture)
from tests.support.bounded import run_bounded

NON_ROOT = {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True}
NNI_EXAMPLE = Path(__file__).parents[1] / "experiment/nni_configs/examples/trials/mnist-pytorch"


async def _agent_uids(kube: Any, experiment_id: str) -> dict[str, int]:
    """The real uid of each pod's agent process (the emulator runs containers as host processes)."""
    def find() -> dict[str, int] | None:
        out = {}
        for pod in kube.core().list_namespaced_pod("default", label_selector=ours(experiment_id)).items:
            for pid in kube.pod_processes("default", pod.metadata.name):
                try:
                    proc = psutil.Process(pid)
                    if "nni_agent" in proc.cmdline():
                        out[pod.metadata.name] = proc.uids().real
                except psutil.Error:
                    pass
        return out or None

    return await until(find, 60, "the pods' agent processes")


def test_non_root_image_reads_its_token(kube_factory, non_root_image, tmp_path: Path) -> None:
    """runAsUser 1000 + runAsNonRoot: the agent reads its token (mode 0444) with no fsGroup of ours,
    which a namespace prescribing a group range (OpenShift) would refuse."""
    kube = kube_factory(images={NON_ROOT_IMAGE: non_root_image})
    cfg = config(kube, tmp_path, pods_service(podSpec={"securityContext": dict(NON_ROOT)}, reuseMode=False,
                                                  dockerImage=NON_ROOT_IMAGE))

    async def body() -> None:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0, x=1))
            uids = await _agent_uids(kube, ts.experiment_id)
            assert set(uids.values()) == {1000}, uids
            done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", timeout=90)
            assert done.status.value == "SUCCEEDED", done.message
            (pod,) = pod_json(kube)
            assert pod["spec"]["securityContext"] == NON_ROOT  # no fsGroup added

    run_bounded(body(), 150)


def _operator_config(kube: Any, tmp_path: Path, platform: str, **ts: Any) -> Any:
    return load_config({
        "nniManagerIp": "127.0.0.1",  # pods on the emulator's host network dial the hub directly
        "trialCodeDirectory": str(code_dir(tmp_path)), "trialConcurrency": 1, "trialGracePeriod": 2,
        "experimentWorkingDirectory": str(tmp_path / "exps"),
        "trainingService": {"platform": platform, "kubeConfig": str(kube.kubeconfig), "reuseMode": False, **ts},
    })


OVERRIDES = {
    # a tainted GPU pool: only pods tolerating the taint are scheduled there, and trials go only there
    # (the image probe, which copies neither, runs on the plain node)
    "podSpec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "nodeSelector": {"kubernetes.io/hostname": "gpu-pool"},
                "securityContext": NON_ROOT},  # a restricted namespace: non-root only
    # a Kubeflow profile namespace: no Istio sidecar (it would keep the pod Running after the agent)
    "podAnnotations": {"sidecar.istio.io/inject": "false"},
}


@pytest.mark.parametrize("platform", ["kubeflow", "frameworkcontroller"])
def test_operator_pods_get_the_overrides(kube_factory, non_root_image, tmp_path: Path, platform: str) -> None:
    kube = kube_factory(nodes=["cpu-0=4,8192,0", "gpu-pool=4,8192,0"], images={NON_ROOT_IMAGE: non_root_image},
                        crd_groups=["kubeflow.org", "frameworkcontroller.microsoft.com"])
    kube.core().patch_node("gpu-pool", {"spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present",
                                                               "effect": "NoSchedule"}]}})
    role = {"command": "python3 trial.py", "cpuNumber": 0.5, "memorySize": "256mb", "dockerImage": NON_ROOT_IMAGE}
    if platform == "kubeflow":
        ts = {"operator": "tf-operator", "apiVersion": "v1", "worker": {"replicas": 1, **role}}
    else:
        ts = {"taskRoles": [{"name": "worker", "taskNumber": 1, "gpuNumber": 0, **role,
                             "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 1, "minSucceedTaskCount": 1}}]}
    cfg = _operator_config(kube, tmp_path, platform, **ts, **OVERRIDES)

    async def body() -> None:
        async with create_training_service(cfg) as ts_:
            job = await ts_.submit_trial_job(form(0, x=2))
            uids = await _agent_uids(kube, ts_.experiment_id)
            assert set(uids.values()) == {1000}, uids
            done = await wait_status(ts_, job.id, "SUCCEEDED", "FAILED", timeout=90)
            assert done.status.value == "SUCCEEDED", done.message
            pods = [p for p in pod_json(kube) if p["metadata"]["name"] in uids]
            assert pods
            for pod in pods:
                assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
                assert pod["spec"]["nodeName"] == "gpu-pool"
                assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
                assert pod["spec"]["securityContext"] == NON_ROOT

    run_bounded(body(), 150)


def test_overrides_mistakes_name_the_field(tmp_path: Path) -> None:
    from nni_manager.config import ConfigError

    base = {"trialConcurrency": 1, "trainingService": {
        "platform": "kubeflow", "operator": "tf-operator", "apiVersion": "v1",
        "worker": {"replicas": 1, "command": "python3 t.py", "cpuNumber": 1, "memorySize": "1gb"}}}
    for value, field, words in [({"sidecar.istio.io/inject": False}, "trainingService.podAnnotations.sidecar.istio.io/inject",
                                 '"false"'),
                                (["a"], "trainingService.podAnnotations", "key: value")]:
        data = {**base, "trainingService": {**base["trainingService"], "podAnnotations": value}}
        with pytest.raises(ConfigError) as info:
            load_config(data, base_dir=tmp_path)
        assert info.value.field == field and words in info.value.fix, str(info.value)
    data = {**base, "trainingService": {**base["trainingService"], "podSpec": "tolerations"}}
    with pytest.raises(ConfigError) as info:
        load_config(data, base_dir=tmp_path)
    assert info.value.field == "trainingService.podSpec"


# ----------------------------------------------------------------------------- NNI v1 configPath

MNIST_STANDIN = r'''
import os, sys
from nni_agent import get_next_parameter, report_final_result
p = get_next_parameter()
role, index = os.environ["NNI_TRIAL_ROLE"], os.environ["NNI_TRIAL_ROLE_INDEX"]
print("replica", role, index, "ps", os.environ.get("FB_PS_IPS"), "workers", os.environ.get("FB_WORKER_IPS"), flush=True)
if role == "worker" and index == "0":
    report_final_result(p["x"])
'''


def test_nni_frameworkcontroller_custom_template(kube_factory, tmp_path: Path, monkeypatch) -> None:
    """NNI's examples/trials/mnist-pytorch/config_frameworkcontroller_custom.yml (only the cluster added): its
    fc_template.yml's roles (ps x2, worker x3), volumes, service account and ports, our agent in
    its container; the Framework passes the CRD schema and the emulated controller runs it."""
    from kubernetes import client

    kube = kube_factory(crd_groups=["frameworkcontroller.microsoft.com"])
    example = tmp_path / "mnist-pytorch"
    example.mkdir()
    for name in ("config_frameworkcontroller_custom.yml", "fc_template.yml", "search_space.json"):
        shutil.copy(NNI_EXAMPLE / name, example / name)
    (example / "mnist.py").write_text(MNIST_STANDIN)  # the trial code NNI's example runs, in small
    path = example / "config_frameworkcontroller_custom.yml"
    data = yaml.safe_load(path.read_text())
    data["frameworkcontrollerConfig"]["kubeConfig"] = str(kube.kubeconfig)  # the one change: which cluster
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setenv("HOME", str(tmp_path))  # ~/nni-experiments
    cfg = load_config(path)
    kube_cfg = cfg.training_service.options
    assert [(r.name, r.replicas, r.command) for r in kube_cfg.roles] == [
        ("ps", 2, "python3 mnist.py"), ("worker", 3, "python mnist.py")]
    assert [(r.min_failed, r.min_succeeded) for r in kube_cfg.roles] == [(1, -1), (1, 3)]
    api = kube.api_client()
    client.CoreV1Api(api).create_namespaced_service_account(  # as NNI's docs have users do
        "default", {"metadata": {"name": "frameworkbarrier"}})

    async def body() -> None:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0, x=7))
            done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", timeout=120)
            assert done.status.value == "SUCCEEDED", done.message
            replicas = ts.experiment_dir / "trials" / job.id / "replicas"
            names = {p.name for p in replicas.iterdir()}  # a ps replica's log may still be in flight as the trial ends
            assert {"worker-0", "worker-1", "worker-2"} <= names <= {"ps-0", "ps-1", "worker-0", "worker-1", "worker-2"}
            out = (replicas / "worker-2" / "trial.stdout").read_text()
            assert "replica worker 2" in out and out.count(",") >= 3, out  # the barrier's peers: 2 ps, 3 workers
            (fw,) = client.CustomObjectsApi(api).list_namespaced_custom_object(
                "frameworkcontroller.microsoft.com", "v1", "default", "frameworks",
                label_selector=ours(ts.experiment_id))["items"]
            roles = {r["name"]: r for r in fw["spec"]["taskRoles"]}
            assert {n: r["taskNumber"] for n, r in roles.items()} == {"ps": 2, "worker": 3}
            for name, port in (("ps", 4001), ("worker", 5001)):
                spec = roles[name]["task"]["pod"]["spec"]
                (container,) = spec["containers"]
                assert container["name"] == "mnist-pytorch" and container["ports"] == [{"containerPort": port}]
                assert "FB_PS_PORT=4001 FB_WORKER_PORT=5001" in container["command"][2]
                assert "--manager" in container["command"]  # the agent runs the role's command
                assert spec["serviceAccountName"] == "frameworkbarrier"
                assert [c["name"] for c in spec["initContainers"]] == ["frameworkbarrier"]
                volumes = {v["name"]: v for v in spec["volumes"]}
                assert volumes["data-volume"]["persistentVolumeClaim"] == {"claimName": "nni-storage"}
                assert {"nni-secret", "nni-agent", "nni-work", "frameworkbarrier-volume"} <= set(volumes)
                assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/tmp/data", "/mnt/frameworkbarrier",
                                                                               "/var/run/nni/secret"}

    run_bounded(body(), 150)


def test_configpath_mistakes_name_the_field_and_fix(tmp_path: Path) -> None:
    from nni_manager.config import ConfigError

    def load(template: Any, **ts: Any) -> Any:
        (tmp_path / "t.yml").write_text(template if isinstance(template, str) else yaml.safe_dump(template))
        return load_config({"trialConcurrency": 1, "trainingService": {
            "platform": "frameworkcontroller", "configPath": "t.yml", **ts}}, base_dir=tmp_path)

    good = yaml.safe_load((NNI_EXAMPLE / "fc_template.yml").read_text())
    assert [r.name for r in load(good).training_service.options.roles] == ["ps", "worker"]
    cases = [
        ({**good, "kind": "Pod"}, {}, "kind: Framework"),
        ("a: [", {}, "YAML"),
        (_renamed(good, "param-server"), {}, "name: paramserver"),
        (_two_containers(good), {}, "one container per task role"),
        (good, {"taskRoles": [{"name": "w", "command": "x"}]}, "remove taskRoles"),
    ]
    for template, ts, fix in cases:
        with pytest.raises(ConfigError) as info:
            load(template, **ts)
        assert info.value.field.startswith(("trainingService.configPath", "trainingService.taskRoles")), str(info.value)
        assert fix in info.value.fix or fix in str(info.value), str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config({"trialConcurrency": 1, "trainingService": {"platform": "frameworkcontroller",
                                                               "configPath": "missing.yml"}}, base_dir=tmp_path)
    assert info.value.field == "trainingService.configPath" and "does not exist" in str(info.value)


def _renamed(template: dict[str, Any], name: str) -> dict[str, Any]:
    out = copy.deepcopy(template)
    out["spec"]["taskRoles"][0]["name"] = name
    return out


def _two_containers(template: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(template)
    containers = out["spec"]["taskRoles"][1]["task"]["pod"]["spec"]["containers"]
    containers.append({**containers[0], "name": "sidecar"})
    return out


def test_a_template_asking_for_gpus_keeps_them_visible(tmp_path: Path) -> None:
    """A template's nvidia.com/gpu limit is the role's GPU count: CUDA_VISIBLE_DEVICES is not blanked."""
    from nni_manager.backends.registry import backend_class

    template = yaml.safe_load((NNI_EXAMPLE / "fc_template.yml").read_text())
    template["spec"]["taskRoles"][1]["task"]["pod"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": 2, "cpu": "4", "memory": "8Gi"}}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(template))
    cfg = load_config({"trialConcurrency": 1, "trainingService": {
        "platform": "frameworkcontroller", "configPath": "t.yml"}}, base_dir=tmp_path)
    assert [r.gpu_number for r in cfg.training_service.options.roles] == [0, 2]
    framework = backend_class("frameworkcontroller")(cfg).render().requests[-1]
    ps, worker = (r["task"]["pod"]["spec"]["containers"][0] for r in framework["spec"]["taskRoles"])
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": ""} in ps["env"]
    assert "CUDA_VISIBLE_DEVICES" not in [e["name"] for e in worker["env"]]
    assert worker["resources"] == {"limits": {"nvidia.com/gpu": 2, "cpu": "4", "memory": "8Gi"}}
