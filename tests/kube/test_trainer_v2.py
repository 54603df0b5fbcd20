"""platform: kubeflow with `operator: trainer` (Kubeflow Trainer v2: TrainJob on a
ClusterTrainingRuntime), end to end on the Kubernetes emulator serving trainer.kubeflow.org and
no kubeflow.org operator (as a new Kubeflow install does): trials run to SUCCEEDED with metrics
from every node; a missing runtime, a cluster with neither Trainer, and a v1 config on a v2-only
cluster are each one line; the emulator refuses what the real API server refuses."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from nni_manager.service import create_training_service
from nni_manager.types import TrialJobStatus
from tests.support.emulators import emulator_factory
from tests.support.kube.fixtures import Kube, KubeNamespace, _test_namespace, namespace_of, start_emulator
from tests.support.kube.operators import (TORCH_DISTRIBUTED, TRAINER, all_metrics, cancel_stops_every_replica, custom_api, experiment, gone, nni_manager_cli,
                                          object_of, replica_views, role, run_async)
from tests.support.manager.helpers import form, until, wait_status

@pytest.fixture(scope="module")
def kube_v2_shared() -> Iterator[Kube]:
    """An emulator serving Kubeflow Trainer v2 only, with the `torch-distributed` runtime installed."""
    import os

    if os.geteuid() != 0:
        pytest.skip("the Kubernetes emulator needs root (mount namespaces for pod volumes)")
    with emulator_factory("kube-emu-", start_emulator, "the Kubernetes emulator") as make:
        kube = make(crd_groups=["trainer.kubeflow.org"])
        custom_api(kube).create_cluster_custom_object(*TRAINER, "clustertrainingruntimes", TORCH_DISTRIBUTED)
        yield kube


@pytest.fixture
def kube_v2(kube_v2_shared: Kube) -> Iterator[KubeNamespace]:
    with _test_namespace(kube_v2_shared, (("trainer.kubeflow.org", "v1alpha1", "trainjobs"),)) as ns:
        yield ns


def trainjob(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": name},
            "spec": spec}


def refusal(kube: Any, body: dict[str, Any]) -> tuple[int, str]:
    from kubernetes.client.exceptions import ApiException

    try:
        custom_api(kube).create_namespaced_custom_object(*TRAINER, namespace_of(kube), "trainjobs", body,
                                                         field_validation="Strict")
    except ApiException as e:
        return e.status, json.loads(e.body)["message"]
    pytest.fail(f"the API server accepted {body}")


# ----------------------------------------------------------------------------- the emulator

def test_emulator_refuses_what_the_trainer_api_refuses(kube_v2):
    status, message = refusal(kube_v2, trainjob("no-ref", {"trainer": {"numNodes": 1}}))
    assert (status, message) == (422, 'TrainJob.trainer.kubeflow.org "no-ref" is invalid: spec.runtimeRef: Required value')
    status, message = refusal(kube_v2, trainjob("no-runtime", {"runtimeRef": {"name": "nope"}}))
    assert status == 403 and 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied' in message, message
    assert 'clustertrainingruntimes.trainer.kubeflow.org "nope" not found' in message, message
    status, message = refusal(kube_v2, trainjob("unknown", {"runtimeRef": {"name": "torch-distributed"},
                                                            "trainer": {"numNodes": 1, "replicas": 2}}))
    assert (status, message) == (400, 'strict decoding error: unknown field "spec.trainer.replicas"')
    status, message = refusal(kube_v2, trainjob("typed", {"runtimeRef": {"name": "torch-distributed"},
                                                          "trainer": {"numNodes": "two"}}))
    assert status == 422 and "spec.trainer.numNodes" in message and "integer" in message, message


# ----------------------------------------------------------------------------- experiments

async def refused_at_start(cfg: Any, what: str) -> str:
    """The training service refuses to start, in one line (returned)."""
    with pytest.raises(Exception) as info:
        async with create_training_service(cfg):
            pytest.fail(f"the training service started {what}")
    text = str(info.value)
    assert "\n" not in text, text
    return text


@run_async
async def test_trainjob_trial_runs_on_every_node_to_succeeded(kube_v2, tmp_path):
    kube = kube_v2
    cfg = experiment(kube, tmp_path, "kubeflow", operator="trainer", reuseMode=False, worker=role(2))
    replicas = ["worker-0", "worker-1"]
    metrics: list[Any] = []
    async with create_training_service(cfg) as ts:
        ts.add_trial_job_metric_listener(metrics.append)
        job = await ts.submit_trial_job(form(0, linger={"worker-0": 1}))
        name = await object_of(kube, "trainjobs", TRAINER, job.id)
        done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=90)
        assert done.status == TrialJobStatus.SUCCEEDED, done.message
        views = await replica_views(ts, job.id, replicas)
        await all_metrics(metrics, job.id, replicas)
        for replica, seen in views.items():
            r, i = replica.split("-")
            assert (seen["NNI_TRIAL_ROLE"], seen["NNI_TRIAL_ROLE_INDEX"]) == (r, i)
            assert seen["NNI_TRIAL_JOB_ID"] == job.id
        await gone(kube, "trainjobs", TRAINER, name)  # reuseMode false: one TrainJob per trial, deleted after
        statuses = [s for s in kube.history("trainjobs", namespace_of(kube), name) if (s or {}).get("conditions")]
        assert statuses, "the TrainJob never had conditions"
        complete = [c for c in statuses[-1]["conditions"] if c["status"] == "True"]
        assert [c["type"] for c in complete] == ["Complete"], statuses[-1]  # the Trainer agrees
        logs = nni_manager_cli("logs", str(ts.experiment_dir), job.id)
        assert logs.returncode == 0, logs.stderr
        assert [line for line in logs.stdout.splitlines() if line.startswith("==> ")] == [f"==> {r} <==" for r in replicas]


@run_async
async def test_missing_runtime_is_one_line_naming_the_runtimes(kube_v2, tmp_path):
    cfg = experiment(kube_v2, tmp_path, "kubeflow", operator="trainer", trainingRuntime="torch-distribted",
                     worker=role(1))
    text = await refused_at_start(cfg, "with a runtime that does not exist")
    assert "'torch-distribted' does not exist" in text, text
    assert "this cluster has torch-distributed" in text and "trainingRuntime" in text, text
    assert custom_api(kube_v2).list_namespaced_custom_object(*TRAINER, namespace_of(kube_v2), "trainjobs")["items"] == []


@run_async
async def test_v1_operator_on_a_trainer_v2_cluster_says_set_operator_trainer(kube_v2, tmp_path):
    cfg = experiment(kube_v2, tmp_path, "kubeflow", operator="pytorch-operator", apiVersion="v1",
                     master=role(1), worker=role(1))
    text = await refused_at_start(cfg, "without the PyTorchJob kind")
    assert "PyTorchJob (kubeflow.org/v1) is not served" in text, text
    assert "Kubeflow Trainer v2" in text and "`operator: trainer`" in text, text


@pytest.mark.parametrize("operator", ["trainer", "tf-operator"])
@run_async
async def test_cluster_with_neither_trainer_is_one_line_naming_what_to_install(kube_ns, tmp_path, operator):
    ts = {"operator": operator, "worker": role(1)} | ({"apiVersion": "v1"} if operator != "trainer" else {})
    cfg = experiment(kube_ns, tmp_path, "kubeflow", **ts)
    text = await refused_at_start(cfg, "on a cluster without any Kubeflow operator")
    assert "not served" in text, text
    assert "neither Kubeflow Trainer v2 (TrainJob) nor the training operator" in text, text
    assert "install Kubeflow Trainer v2" in text and "training operator v1.8" in text, text


def test_trainjob_dry_run_passes_the_trainer_api(kube_v2, tmp_path):
    """The TrainJob NNI would submit (the dry run's object) is accepted by the API server (strict)."""
    from nni_manager.backends.registry import backend_class

    cfg = experiment(kube_v2, tmp_path, "kubeflow", operator="trainer", worker=role(2))
    backend = backend_class("kubeflow")(cfg)
    objects = backend.render().requests
    main = objects[-1]
    assert main["kind"] == "TrainJob" and main["spec"]["runtimeRef"]["name"] == "torch-distributed", main
    assert main["spec"]["trainer"]["numNodes"] == 2
    main["metadata"]["namespace"] = namespace_of(kube_v2)
    custom_api(kube_v2).create_namespaced_custom_object(*TRAINER, namespace_of(kube_v2), "trainjobs", main,
                                                        field_validation="Strict", dry_run="All")


@run_async
async def test_trainjob_cancel_stops_every_node_and_deletes_the_trainjob(kube_v2, tmp_path):
    kube = kube_v2
    cfg = experiment(kube, tmp_path, "kubeflow", operator="trainer", reuseMode=False, worker=role(2))
    async with create_training_service(cfg) as ts:
        job = await ts.submit_trial_job(form(0, forever=["worker"]))
        await cancel_stops_every_replica(ts, kube, "trainjobs", TRAINER, job.id, ["worker-0", "worker-1"])


@run_async
async def test_pod_spec_a_trainjob_cannot_carry_is_one_line_at_start(kube_v2, tmp_path):
    cfg = experiment(kube_v2, tmp_path, "kubeflow", operator="trainer", worker=role(1),
                     podSpec={"hostIPC": False, "containers": [{"name": "node", "imagePullPolicy": "IfNotPresent"}]})
    text = await refused_at_start(cfg, "with a podSpec no TrainJob can carry")
    assert "podSpec.containers[].imagePullPolicy, podSpec.hostIPC" in text, text
    assert "runtimePatches" in text and "ClusterTrainingRuntime torch-distributed" in text, text
    assert custom_api(kube_v2).list_namespaced_custom_object(*TRAINER, namespace_of(kube_v2), "trainjobs")["items"] == []


@pytest.mark.slow
@run_async
async def test_trainjob_failing_node_fails_the_trial(kube_v2, tmp_path):
    kube = kube_v2
    cfg = experiment(kube, tmp_path, "kubeflow", operator="trainer", reuseMode=False, worker=role(2))
    async with create_training_service(cfg) as ts:
        job = await ts.submit_trial_job(form(0, fail=["worker-1"], linger={"worker-0": 30, "worker-1": 1}))
        name = await object_of(kube, "trainjobs", TRAINER, job.id)
        done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=60)
        assert done.status == TrialJobStatus.FAILED, done.message
        assert done.message.startswith("worker-1: ") and "3" in done.message, done.message
        # the runtime's pods restart on failure (JobSet's OnFailure): the failed node's agent runs again
        # until the manager deletes the TrainJob, when the environment is released after the trial's end
        await until(lambda: not custom_api(kube).list_namespaced_custom_object(
            *TRAINER, namespace_of(kube), "trainjobs", label_selector=f"trialId={job.id}")["items"], 90,
            f"TrainJob {name} to be deleted")
        await until(lambda: not kube.core().list_namespaced_pod(namespace_of(kube)).items, 60, "its pods to go")


@run_async
async def test_the_documented_role_runs_trainjobs_without_reading_runtimes(kube_factory, tmp_path):
    """The docs' Role (namespaced: it cannot grant the cluster-scoped runtimes) runs a TrainJob
    experiment; a misspelt runtime is then the Trainer webhook's refusal on the trial, in one line."""
    from tests.support.kube.rbac_user import USER_TOKEN, bind_alice, doc_role

    kube = kube_factory(tokens=[f"{USER_TOKEN}=alice:rbac"], crd_groups=["trainer.kubeflow.org"])
    custom_api(kube).create_cluster_custom_object(*TRAINER, "clustertrainingruntimes", TORCH_DISTRIBUTED)
    kubeconfig = bind_alice(kube, doc_role())
    for n, (runtime, outcome) in enumerate((("torch-distributed", TrialJobStatus.SUCCEEDED),
                                            ("torch-distribted", TrialJobStatus.FAILED))):
        (tmp_path / f"r{n}").mkdir()  # short: the hub's socket lives under it (107-byte Unix limit)
        cfg = experiment(kube, tmp_path / f"r{n}", "kubeflow", operator="trainer", reuseMode=False,
                         trainingRuntime=runtime, worker=role(1), kubeConfig=str(kubeconfig))
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0))
            done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=90)
            assert done.status == outcome, done.message
            if outcome == TrialJobStatus.FAILED:
                assert "\n" not in done.message and "torch-distribted" in done.message, done.message
                assert "must be created before the TrainJob is created" in done.message, done.message
                assert "RBAC" not in done.message, done.message  # an admission webhook's 403, not a permission
