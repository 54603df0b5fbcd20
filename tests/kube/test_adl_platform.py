"""platform: adl (AdaptDL) end to end on the Kubernetes emulator, with AdaptDL's job controller
(emulator/adaptdl.py) and the AdaptDLJob validated with the published CRD schema: NNI's v1 config,
one AdaptDLJob per trial whose pod (named by AdaptDL) runs the agent, the checkpoint claim, a
failing trial, and the CRD's own refusals.

The published CRD (petuum/adaptdl, helm/adaptdl-sched/templates/adaptdl-crd.yaml) ships in no
package; the emulator reads its schema from shared/schemas (adaptdl/adaptdljob-v1.schema.json)
like the other CRDs, and these tests are skipped where that file is not there."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from nni_manager.config import ConfigError
from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.kube.emulator import crds
from tests.support.kube.emulator.adaptdl import SCHEMA_FILE
from tests.support.manager.helpers import form, until, wait_status
from tests.support.bounded import run_bounded

NS = "default"
ADL = ("adaptdl.petuum.com", "v1")
IMAGE = "nni-test/python:3.11"


def _schema_present() -> bool:
    try:
        return (crds.schemas_dir() / SCHEMA_FILE).is_file()
    except FileNotFoundError:
        return False


needs_crd = pytest.mark.skipif(not _schema_present(), reason=(
    f"the published AdaptDL CRD schema is not in shared/schemas ({SCHEMA_FILE}: the v1 openAPIV3Schema of "
    "petuum/adaptdl helm/adaptdl-sched/templates/adaptdl-crd.yaml)"))

TRIAL = r'''
import json, os, sys, time
from nni_agent import get_next_parameter, report_final_result
p = get_next_parameter()
keys = ("ADAPTDL_JOB_ID", "ADAPTDL_REPLICA_RANK", "ADAPTDL_NUM_REPLICAS", "ADAPTDL_CHECKPOINT_PATH", "NNI_PLATFORM")
print("SEEN " + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
time.sleep(p.get("sleep", 0))
if p.get("fail"):
    sys.exit(3)
report_final_result(p.get("x", 1))
'''


def v1_config(tmp_path: Path, **trial: Any) -> Any:
    code = tmp_path / "code"  # "in the image": the emulated pods see this machine's files
    code.mkdir(exist_ok=True)
    (code / "mnist.py").write_text(TRIAL)
    return load_config({  # examples/trials/mnist-pytorch/config_adl.yml, pointed at the test bed
        "authorName": "default", "experimentName": "example_mnist_pytorch", "trialConcurrency": 1,
        "maxExecDuration": "1h", "maxTrialNum": 10, "nniManagerIp": "127.0.0.1", "logCollection": "http",
        "trainingServicePlatform": "adl", "searchSpace": {"x": {"_type": "choice", "_value": [1, 2]}},
        "useAnnotation": False, "tuner": {"builtinTunerName": "TPE", "classArgs": {"optimize_mode": "maximize"}},
        "experimentWorkingDirectory": str(tmp_path / "exps"), "trialGracePeriod": 2,
        "trial": {"image": IMAGE, "command": f"{sys.executable} mnist.py", "codeDir": str(code), "gpuNum": 0,
                  "cpuNum": 1, "memorySize": "512Mi", **trial},
    }, base_dir=tmp_path)


def apis(kube: Any) -> tuple[Any, Any]:
    from kubernetes import client

    return client.CustomObjectsApi(kube.api_client()), client.CoreV1Api(kube.api_client())


@needs_crd
def test_a_trial_is_an_adaptdl_job_whose_pod_runs_the_agent(kube_factory, tmp_path: Path) -> None:
    kube = kube_factory(crd_groups=["adaptdl.petuum.com"])
    cfg = v1_config(tmp_path, kubeConfig=str(kube.kubeconfig), adaptive=True, checkpoint={"storageClass": "standard", "storageSize": "1Gi"},
                    imagePullSecrets=[{"name": "my-registry"}])
    custom, core = apis(kube)

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0, x=2, sleep=1.5))
            job = await until(lambda: (custom.list_namespaced_custom_object(
                *ADL, NS, "adaptdljobs", label_selector=f"trialId={t.id}")["items"] or [None])[0], 30, "the job")
            name, uid = job["metadata"]["name"], job["metadata"]["uid"]
            await wait_status(ts, t.id, "RUNNING", timeout=60)
            pods = core.list_namespaced_pod(NS, label_selector=f"adaptdl/job={name}").items
            assert [p.metadata.name for p in pods] == [f"{name}-{uid}-0-0"]  # AdaptDL's name, not the agent's
            env = {e.name: e.value for e in pods[0].spec.containers[0].env}
            assert env["ADAPTDL_CHECKPOINT_PATH"] == "/adaptdl/checkpoint" and env["ADAPTDL_REPLICA_RANK"] == "0"
            d = await wait_status(ts, t.id, "SUCCEEDED", timeout=60)
            assert d.agents == [name], d
            assert job["spec"]["preemptible"] is True and job["spec"]["maxReplicas"] == 1
            assert job["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "my-registry"}]
            claim = core.read_namespaced_persistent_volume_claim(f"{name}-checkpoint", NS)
            assert claim.spec.storage_class_name == "standard" and claim.metadata.owner_references[0].uid == uid
            # the agent exits after its one trial, its pod succeeds: AdaptDL records the job's outcome
            phases = await until(lambda: (ps := [s.get("phase") for s in kube.history("adaptdljobs", NS, name)])
                                 and ps[-1] == "Succeeded" and ps, 30, "the job to succeed")
            assert phases[:3] == ["Starting", "Running", "Succeeded"], phases

    run_bounded(main(), 150)
    assert custom.list_namespaced_custom_object(*ADL, NS, "adaptdljobs")["items"] == []  # cleaned up


@needs_crd
def test_a_failing_trial_fails_its_job(kube_factory, tmp_path: Path) -> None:
    kube = kube_factory(crd_groups=["adaptdl.petuum.com"])
    cfg = v1_config(tmp_path, kubeConfig=str(kube.kubeconfig))

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0, fail=True))
            d = await wait_status(ts, t.id, "FAILED", timeout=60)
            assert "exit code 3" in d.message, d.message

    run_bounded(main(), 150)


@needs_crd
def test_the_published_crd_schema_is_applied(kube_factory) -> None:
    from kubernetes.client.exceptions import ApiException

    kube = kube_factory(crd_groups=["adaptdl.petuum.com"])
    custom, _ = apis(kube)
    body = {"apiVersion": "adaptdl.petuum.com/v1", "kind": "AdaptDLJob", "metadata": {"name": "bad"},
            "spec": {"maxReplicas": 0}}
    with pytest.raises(ApiException) as info:
        custom.create_namespaced_custom_object(*ADL, NS, "adaptdljobs", body)
    assert info.value.status == 422
    assert "spec.maxReplicas" in info.value.body and "spec.template" in info.value.body, info.value.body
    body["metadata"]["name"] = "x" * 64
    body["spec"] = {"template": {}}
    with pytest.raises(ApiException) as info:
        custom.create_namespaced_custom_object(*ADL, NS, "adaptdljobs", body)
    assert info.value.status == 422 and "metadata.name" in info.value.body, info.value.body


@pytest.mark.parametrize("trial,field,words", [
    ({"checkpoint": {"storageClass": "standard", "storageSize": "big"}}, "storageSize", "quantity"),
    ({"imagePullSecrets": ["my-registry"]}, "imagePullSecrets", "{name: <secret>}"),
    ({"image": None}, "image", "is required"),
])
def test_config_mistakes_name_the_field(tmp_path: Path, trial: dict, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        v1_config(tmp_path, **trial)
    assert info.value.field.endswith(field) and words in str(info.value), str(info.value)


@needs_crd
def test_a_preempted_pod_ends_its_trial_and_leaves_nothing(kube_factory, tmp_path: Path) -> None:
    """AdaptDL moves an adaptive job by deleting its pod and starting the next group; the trial's
    process went with the first pod, so the trial ends saying so, and the job is cleaned up."""
    kube = kube_factory(crd_groups=["adaptdl.petuum.com"])
    cfg = v1_config(tmp_path, kubeConfig=str(kube.kubeconfig), adaptive=True)
    custom, core = apis(kube)

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0, sleep=60))
            await wait_status(ts, t.id, "RUNNING", timeout=60)
            (pod,) = core.list_namespaced_pod(NS, label_selector="adaptdl=true").items
            core.delete_namespaced_pod(pod.metadata.name, NS)
            d = await wait_status(ts, t.id, "SYS_CANCELED", "FAILED", timeout=60)
            assert pod.metadata.name in d.message, d.message

    run_bounded(main(), 150)
    assert custom.list_namespaced_custom_object(*ADL, NS, "adaptdljobs")["items"] == []
    kube.wait_for(lambda: not core.list_namespaced_pod(NS, label_selector="adaptdl=true").items, 60,
                  what="no AdaptDL pod left")
