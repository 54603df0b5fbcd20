"""platform: kubeflow (TFJob, PyTorchJob) and platform: frameworkcontroller (Framework), end to end on
the Kubernetes emulator through the backends' real code (the official client): multi-replica trials
whose replicas see the operator's environment, completion by the operator's rule (and the object's
own conditions agreeing), reuse, start-up errors, NNI's configs (v2, v1, Python-built) and dry runs."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nni_manager.backends.registry import backend_class
from nni_manager.config import ConfigError
from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from nni_manager.types import TrialJobStatus
from tests.support.manager.helpers import form, until, wait_status
from tests.support.kube.fixtures import namespace_of
from tests.support.kube.operators import (all_metrics, cancel_stops_every_replica, custom_api, experiment, gone, last_condition, nni_manager_cli, object_of, replica_views, role, run_async, stopped,
                                          task_role)

NS = "default"
KUBEFLOW = ("kubeflow.org", "v1")
FC = ("frameworkcontroller.microsoft.com", "v1")


# ----------------------------------------------------------------------------- helpers

# ----------------------------------------------------------------------------- 1-2. TFJob

@run_async
async def test_tfjob_two_workers_one_ps(kube_crd_ns, tmp_path):
    kube = kube_crd_ns
    cfg = experiment(kube, tmp_path, "kubeflow", operator="tf-operator", apiVersion="v1", reuseMode=False,
                     worker=role(2), ps=role(1))
    replicas = ["ps-0", "worker-0", "worker-1"]
    metrics: list[Any] = []
    async with create_training_service(cfg) as ts:
        ts.add_trial_job_metric_listener(metrics.append)
        # the ps runs forever (as a real one does): worker 0 alone ends the trial
        job = await ts.submit_trial_job(form(0, forever=["ps"], linger={"worker-0": 1.5}))
        await wait_status(ts, job.id, "RUNNING", timeout=60)
        name = await object_of(kube, "tfjobs", KUBEFLOW, job.id)
        done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=60)
        assert done.status == TrialJobStatus.SUCCEEDED, done.message
        views = await replica_views(ts, job.id, replicas)
        await all_metrics(metrics, job.id, replicas)
        for replica, seen in views.items():
            r, i = replica.split("-")
            assert (seen["NNI_TRIAL_ROLE"], seen["NNI_TRIAL_ROLE_INDEX"]) == (r, i)
            assert seen["NNI_TRIAL_JOB_ID"] == job.id
            tf = json.loads(seen["TF_CONFIG"])
            assert tf["task"] == {"type": r, "index": int(i)}
            assert sorted(tf["cluster"]) == ["ps", "worker"]
            assert [a.split(".")[0] for a in tf["cluster"]["worker"]] == [f"{name}-worker-0", f"{name}-worker-1"]
            assert [a.split(".")[0] for a in tf["cluster"]["ps"]] == [f"{name}-ps-0"]
        await stopped(views["ps-0"]["pid"])  # the trial is over: its ps is stopped
        await gone(kube, "tfjobs", KUBEFLOW, name)  # reuseMode false: one object per trial, deleted after
        cond = last_condition(kube, "tfjobs", name)
        assert (cond["type"], cond["status"]) == ("Succeeded", "True"), cond  # the object agrees
        assert (await ts.get_trial_job(job.id)).status == TrialJobStatus.SUCCEEDED
        # `nni-manager logs` shows every replica's log under its name, or the one asked for
        logs = nni_manager_cli("logs", str(ts.experiment_dir), job.id)
        assert logs.returncode == 0, logs.stderr
        assert [line for line in logs.stdout.splitlines() if line.startswith("==> ")] == [
            f"==> {r} <==" for r in replicas]
        one = nni_manager_cli("logs", str(ts.experiment_dir), job.id, "--replica", "worker-1")
        assert one.returncode == 0 and one.stdout.count("SEEN ") == 1 and '"worker"' in one.stdout
        wrong = nni_manager_cli("logs", str(ts.experiment_dir), job.id, "--replica", "chief-0")
        assert wrong.returncode == 2 and "ps-0, worker-0, worker-1" in wrong.stderr


@run_async
async def test_tfjob_cancel_stops_every_replica_and_deletes_the_job(kube_crd_ns, tmp_path):
    kube = kube_crd_ns
    cfg = experiment(kube, tmp_path, "kubeflow", operator="tf-operator", apiVersion="v1", reuseMode=False,
                     worker=role(2), ps=role(1))
    async with create_training_service(cfg) as ts:
        job = await ts.submit_trial_job(form(0, forever=["ps", "worker"]))
        await cancel_stops_every_replica(ts, kube, "tfjobs", KUBEFLOW, job.id, ["ps-0", "worker-0", "worker-1"])


@run_async
async def test_tfjob_failing_worker_fails_the_trial(kube_crd_ns, tmp_path):
    kube = kube_crd_ns
    cfg = experiment(kube, tmp_path, "kubeflow", operator="tf-operator", apiVersion="v1", reuseMode=False,
                     worker=role(2), ps=role(1))
    async with create_training_service(cfg) as ts:
        job = await ts.submit_trial_job(form(0, fail=["worker-1"], forever=["ps"], linger={"worker-0": 30, "worker-1": 1}))
        await wait_status(ts, job.id, "RUNNING", timeout=60)
        name = await object_of(kube, "tfjobs", KUBEFLOW, job.id)
        done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=60)
        assert done.status == TrialJobStatus.FAILED, done.message
        assert done.message.startswith("worker-1: "), done.message
        assert "3" in done.message, done.message  # the exit code
        await gone(kube, "tfjobs", KUBEFLOW, name)
        cond = last_condition(kube, "tfjobs", name)
        assert (cond["type"], cond["status"]) == ("Failed", "True"), cond


# ----------------------------------------------------------------------------- 3. PyTorchJob

@pytest.mark.parametrize("master_fails", [False, True], ids=["master-succeeds", "master-fails"])
@run_async
async def test_pytorchjob_master_and_two_workers(kube_crd_ns, tmp_path, master_fails):
    kube = kube_crd_ns
    cfg = experiment(kube, tmp_path, "kubeflow", operator="pytorch-operator", apiVersion="v1", reuseMode=False,
                     master=role(1), worker=role(2))
    replicas = ["master-0", "worker-0", "worker-1"]
    async with create_training_service(cfg) as ts:
        # the workers run on: the master's outcome is the trial's
        job = await ts.submit_trial_job(form(0, forever=["worker"], linger={"master-0": 1},
                                             fail=["master-0"] if master_fails else []))
        await wait_status(ts, job.id, "RUNNING", timeout=60)
        name = await object_of(kube, "pytorchjobs", KUBEFLOW, job.id)
        done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=60)
        views = await replica_views(ts, job.id, replicas)
        for rank, replica in enumerate(replicas):
            seen = views[replica]
            assert seen["MASTER_ADDR"] == f"{name}-master-0"
            assert seen["WORLD_SIZE"] == "3"
            assert seen["RANK"] == str(rank)
        if master_fails:
            assert done.status == TrialJobStatus.FAILED, done.message
            assert done.message.startswith("master-0: "), done.message
        else:
            assert done.status == TrialJobStatus.SUCCEEDED, done.message
        for w in ("worker-0", "worker-1"):
            await stopped(views[w]["pid"])
        await gone(kube, "pytorchjobs", KUBEFLOW, name)
        cond = last_condition(kube, "pytorchjobs", name)
        assert (cond["type"], cond["status"]) == ("Failed" if master_fails else "Succeeded", "True"), cond


# ----------------------------------------------------------------------------- 4. Framework

@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
@run_async
async def test_framework_completion_policy(kube_crd_ns, tmp_path, outcome):
    kube = kube_crd_ns
    cfg = experiment(kube, tmp_path, "frameworkcontroller", reuseMode=False,
                     taskRoles=[task_role("ps", 1, 1, -1), task_role("worker", 2, 1, 1)])
    replicas = ["ps-0", "worker-0", "worker-1"]
    if outcome == "succeeded":  # one worker succeeds while the other and the ps run on
        params = {"forever": ["ps", "worker-1"], "linger": {"worker-0": 1}}
    else:  # one worker fails while the other and the ps run on
        params = {"forever": ["ps", "worker-0"], "fail": ["worker-1"], "linger": {"worker-1": 1}}
    async with create_training_service(cfg) as ts:
        job = await ts.submit_trial_job(form(0, **params))
        await wait_status(ts, job.id, "RUNNING", timeout=60)
        name = await object_of(kube, "frameworks", FC, job.id)
        done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=60)
        views = await replica_views(ts, job.id, replicas)
        if outcome == "succeeded":
            assert done.status == TrialJobStatus.SUCCEEDED, done.message
            still = ["ps-0", "worker-1"]
        else:
            assert done.status == TrialJobStatus.FAILED, done.message
            assert done.message.startswith("worker-1: "), done.message
            still = ["ps-0", "worker-0"]
        for seen in views.values():  # the barrier's peer addresses, in every member
            assert len(seen["FB_WORKER_IPS"].split(",")) == 2, seen
            assert len(seen["FB_PS_IPS"].split(",")) == 1, seen
        for replica in still:  # members still running when the policy decided are stopped
            await stopped(views[replica]["pid"])
        await gone(kube, "frameworks", FC, name)


# ----------------------------------------------------------------------------- 5. reuse

@run_async
async def test_kubeflow_reuse_runs_trials_on_a_pool(kube_crd_ns, tmp_path):
    kube = kube_crd_ns
    cfg = experiment(kube, tmp_path, "kubeflow", concurrency=2, operator="tf-operator", apiVersion="v1",
                     reuseMode=True, worker=role(1))
    api = custom_api(kube)
    seen_objects: set[str] = set()
    async with create_training_service(cfg) as ts:
        jobs = [await ts.submit_trial_job(form(i, linger={"worker-0": 0.3})) for i in range(4)]

        async def all_done() -> bool:
            listed = api.list_namespaced_custom_object(*KUBEFLOW, namespace_of(kube), "tfjobs",
                                                       label_selector=f"expId={ts.experiment_id}")["items"]
            seen_objects.update(o["metadata"]["name"] for o in listed)
            return all(d.status.is_terminal for d in [await ts.get_trial_job(j.id) for j in jobs])

        await until(all_done, 90, "4 trials to end")
        details = [await ts.get_trial_job(j.id) for j in jobs]
        assert [d.status for d in details] == [TrialJobStatus.SUCCEEDED] * 4, [(d.status, d.message) for d in details]
        envs = {d.environment_id for d in details}
        assert None not in envs and len(envs) <= 2, envs
        assert 1 <= len(seen_objects) <= 2, seen_objects
        assert all(not o.get("metadata", {}).get("labels", {}).get("trialId")  # pool objects: no trial of their own
                   for o in api.list_namespaced_custom_object(*KUBEFLOW, namespace_of(kube), "tfjobs")["items"])
    # the pool goes with the experiment
    assert api.list_namespaced_custom_object(*KUBEFLOW, namespace_of(kube), "tfjobs")["items"] == []


# ----------------------------------------------------------------------------- 6. clear errors at start

@run_async
async def test_operator_not_installed_is_one_clear_line(kube_ns, tmp_path):
    kube = kube_ns  # no CRDs
    cfg = experiment(kube, tmp_path, "kubeflow", operator="tf-operator", apiVersion="v1", worker=role(1))
    ts = create_training_service(cfg)
    with pytest.raises(Exception) as info:
        async with ts:
            pytest.fail("the training service started without the TFJob kind")
    text = str(info.value)
    assert "\n" not in text and "TFJob" in text and "not served" in text and "installed" in text, text
    assert "kubeflow.org/v1" in text, text


@run_async
async def test_unserved_api_version_is_one_clear_line(kube_crd_ns, tmp_path):
    kube = kube_crd_ns
    cfg = experiment(kube, tmp_path, "kubeflow", operator="tf-operator", apiVersion="v1beta2", worker=role(1))
    with pytest.raises(Exception) as info:
        async with create_training_service(cfg):
            pytest.fail("the training service started with an unserved apiVersion")
    text = str(info.value)
    assert "\n" not in text and "TFJob" in text and "v1beta2" in text and "not served" in text, text
    assert custom_api(kube).list_namespaced_custom_object(*KUBEFLOW, namespace_of(kube), "tfjobs")["items"] == []


# ----------------------------------------------------------------------------- 7. NNI's configs

V2_KUBEFLOW = """
searchSpace: {x: {_type: choice, _value: [1, 2]}}
trialCodeDirectory: .
trialConcurrency: 2
tuner: {name: TPE, classArgs: {optimize_mode: maximize}}
trainingService:
  platform: kubeflow
  operator: tf-operator
  apiVersion: v1
  reuseMode: false
  storage: {storageType: nfs, server: nfs.example.org, path: /var/nfs/general}
  worker: {replicas: 2, command: python3 mnist.py, gpuNumber: 1, cpuNumber: 2, memorySize: 8192mb,
           dockerImage: msranni/nni:latest, codeDirectory: .}
  ps: {replicas: 1, command: python3 mnist.py, gpuNumber: 0, cpuNumber: 1, memorySize: 4gb,
       dockerImage: msranni/nni:latest, codeDirectory: .}
"""

V1_KUBEFLOW = """
authorName: default
experimentName: example_dist
trialConcurrency: 2
maxExecDuration: 1h
maxTrialNum: 10
trainingServicePlatform: kubeflow
searchSpace: {x: {_type: choice, _value: [1, 2]}}
tuner: {builtinTunerName: TPE, classArgs: {optimize_mode: maximize}}
kubeflowConfig:
  operator: tf-operator
  apiVersion: v1
  storage: nfs
  nfs: {server: nfs.example.org, path: /var/nfs/general}
  reuseMode: false
trial:
  codeDir: .
  worker: {replicas: 2, command: python3 mnist.py, gpuNum: 1, cpuNum: 2, memoryMB: 8192, image: msranni/nni:latest}
  ps: {replicas: 1, command: python3 mnist.py, gpuNum: 0, cpuNum: 1, memoryMB: 4096, image: msranni/nni:latest}
"""

V2_FC = """
searchSpace: {x: {_type: choice, _value: [1, 2]}}
trialCodeDirectory: .
trialConcurrency: 2
tuner: {name: TPE, classArgs: {optimize_mode: maximize}}
trainingService:
  platform: frameworkcontroller
  reuseMode: false
  serviceAccountName: frameworkcontroller
  storage: {storageType: nfs, server: nfs.example.org, path: /var/nfs/general}
  taskRoles:
    - name: worker
      taskNumber: 2
      command: python3 mnist.py
      gpuNumber: 1
      cpuNumber: 2
      memorySize: 8gb
      dockerImage: msranni/nni:latest
      frameworkAttemptCompletionPolicy: {minFailedTaskCount: 1, minSucceedTaskCount: 1}
    - name: ps
      taskNumber: 1
      command: python3 ps.py
      gpuNumber: 0
      cpuNumber: 1
      memorySize: 2048mb
      dockerImage: msranni/nni:latest
      frameworkAttemptCompletionPolicy: {minFailedTaskCount: 1, minSucceedTaskCount: -1}
"""

V1_FC = """
authorName: default
experimentName: example_fc
trialConcurrency: 2
maxExecDuration: 1h
maxTrialNum: 10
trainingServicePlatform: frameworkcontroller
searchSpace: {x: {_type: choice, _value: [1, 2]}}
tuner: {builtinTunerName: TPE, classArgs: {optimize_mode: maximize}}
frameworkcontrollerConfig:
  storage: nfs
  serviceAccountName: frameworkcontroller
  nfs: {server: nfs.example.org, path: /var/nfs/general}
  reuseMode: false
trial:
  codeDir: .
  taskRoles:
    - name: worker
      taskNum: 2
      command: python3 mnist.py
      gpuNum: 1
      cpuNum: 2
      memoryMB: 8192
      image: msranni/nni:latest
      frameworkAttemptCompletionPolicy: {minFailedTaskCount: 1, minSucceededTaskCount: 1}
    - name: ps
      taskNum: 1
      command: python3 ps.py
      gpuNum: 0
      cpuNum: 1
      memoryMB: 2048
      image: msranni/nni:latest
      frameworkAttemptCompletionPolicy: {minFailedTaskCount: 1, minSucceededTaskCount: -1}
"""


def _load(tmp_path: Path, text: str, name: str):
    path = tmp_path / name
    path.write_text(text)
    return load_config(path)


def _nni_built(platform: str, code: Path, *, reuse: bool = False) -> dict[str, Any]:
    try:
        from nni.experiment import ExperimentConfig
        from nni.experiment.config.training_services.frameworkcontroller import (
            FrameworkAttemptCompletionPolicy, FrameworkControllerRoleConfig)
        from nni.experiment.config.training_services.k8s_storage import K8sStorageConfig
        from nni.experiment.config.training_services.kubeflow import KubeflowRoleConfig
    except ImportError as e:
        pytest.skip(f"NNI's Python API is not importable here ({e}); scripts/test.sh installs nni==3.0")
    c = ExperimentConfig(platform)
    c.trial_concurrency = 2
    c.trial_code_directory = str(code)
    c.search_space = {"x": {"_type": "choice", "_value": [1, 2]}}
    c.tuner.name = "TPE"
    c.tuner.class_args = {"optimize_mode": "maximize"}
    c.nni_manager_ip = "127.0.0.1"
    ts = c.training_service
    ts.reuse_mode = reuse
    ts.storage = K8sStorageConfig(storage_type="nfs", server="nfs.example.org", path="/var/nfs/general")
    if platform == "kubeflow":
        ts.operator, ts.api_version = "tf-operator", "v1"
        ts.worker = KubeflowRoleConfig(replicas=2, command="python3 mnist.py", gpu_number=1, cpu_number=2,
                                       memory_size="8192mb", code_directory=str(code))
        ts.ps = KubeflowRoleConfig(replicas=1, command="python3 mnist.py", gpu_number=0, cpu_number=1,
                                   memory_size="4gb", code_directory=str(code))
    else:
        ts.service_account_name = "frameworkcontroller"
        ts.task_roles = [
            FrameworkControllerRoleConfig(name="worker", task_number=2, command="python3 mnist.py", gpu_number=1,
                                          cpu_number=2, memory_size="8gb", framework_attempt_completion_policy=
                                          FrameworkAttemptCompletionPolicy(min_failed_task_count=1,
                                                                           min_succeed_task_count=1)),
            FrameworkControllerRoleConfig(name="ps", task_number=1, command="python3 ps.py", gpu_number=0,
                                          cpu_number=1, memory_size="2048mb", framework_attempt_completion_policy=
                                          FrameworkAttemptCompletionPolicy(min_failed_task_count=1,
                                                                           min_succeed_task_count=-1)),
        ]
    return c.json()


@pytest.mark.parametrize("platform,v2,v1", [("kubeflow", V2_KUBEFLOW, V1_KUBEFLOW), ("frameworkcontroller", V2_FC, V1_FC)])
def test_nni_configs_load_to_the_same_options(tmp_path, platform, v2, v1):
    new, old = _load(tmp_path, v2, "v2.yml"), _load(tmp_path, v1, "v1.yml")
    for cfg in (new, old):
        assert cfg.training_service.platform == platform
        assert cfg.trial_concurrency == 2
        assert cfg.trial_code_directory == tmp_path
    kube = new.training_service.options
    assert kube == old.training_service.options
    assert kube.reuse_mode is False
    assert (kube.storage.kind, kube.storage.server, kube.storage.path) == ("nfs", "nfs.example.org", "/var/nfs/general")
    roles = {r.name: r for r in kube.roles}
    assert (roles["worker"].replicas, roles["worker"].gpu_number, roles["worker"].cpu_number,
            roles["worker"].memory_mb, roles["worker"].docker_image) == (2, 1, 2, 8192, "msranni/nni:latest")
    assert roles["ps"].replicas == 1 and roles["ps"].memory_mb in (4096, 2048)
    if platform == "kubeflow":
        assert (kube.operator, kube.api_version) == ("tf-operator", "v1")
        assert [r.name for r in kube.roles] == ["worker", "ps"]
    else:
        assert kube.service_account_name == "frameworkcontroller"
        assert (roles["worker"].min_failed, roles["worker"].min_succeeded) == (1, 1)
        assert (roles["ps"].min_failed, roles["ps"].min_succeeded) == (1, -1)
        assert roles["ps"].command == "python3 ps.py"
    built = load_config(_nni_built(platform, tmp_path))  # NNI's Python API, as `config.json()` gives it
    assert built.training_service.platform == platform
    assert built.training_service.options == kube
    assert built.trial_concurrency == 2 and built.trial_code_directory == tmp_path


@pytest.mark.parametrize("change,field,words", [
    (lambda ts: ts.pop("operator"), "trainingService.operator", "operator: "),
    (lambda ts: ts.update(operator="pytorch-operator", master={"replicas": 1, "command": "python3 m.py"}),
     "trainingService.ps", "master / worker"),
    (lambda ts: ts["storage"].update(storageType="s3"), "trainingService.storage.storageType", "nfs, pvc or azureStorage"),
    (lambda ts: ts.update(apiVersion=None), "trainingService.apiVersion", "apiVersion: "),
    (lambda ts: ts["worker"].update(memorySize="lots"), "trainingService.worker.memorySize", "8gb"),
])
def test_kubeflow_config_mistakes_name_the_field_and_fix(tmp_path, change, field, words):
    import yaml

    data = yaml.safe_load(V2_KUBEFLOW)
    change(data["trainingService"])
    with pytest.raises(ConfigError) as info:
        load_config(data, base_dir=tmp_path)
    assert info.value.field == field, str(info.value)
    assert words in info.value.fix, str(info.value)


def test_frameworkcontroller_config_mistakes_name_the_field_and_fix(tmp_path):
    import yaml

    data = yaml.safe_load(V2_FC)
    data["trainingService"]["taskRoles"][1]["name"] = "worker"
    with pytest.raises(ConfigError) as info:
        load_config(data, base_dir=tmp_path)
    assert info.value.field == "trainingService.taskRoles[1].name" and "unique" in str(info.value)
    data = yaml.safe_load(V2_FC)
    del data["trainingService"]["taskRoles"]
    with pytest.raises(ConfigError) as info:
        load_config(data, base_dir=tmp_path)
    assert info.value.field == "trainingService.taskRoles" and "taskRoles: [" in info.value.fix
    data = yaml.safe_load(V2_FC)
    data["trainingService"]["taskRoles"][0]["frameworkAttemptCompletionPolicy"]["minSucceedTasks"] = 1
    with pytest.raises(ConfigError) as info:
        load_config(data, base_dir=tmp_path)
    assert "frameworkAttemptCompletionPolicy.minSucceedTasks" in info.value.field, str(info.value)


# ----------------------------------------------------------------------------- 8. dry run

@pytest.mark.parametrize("platform,text", [("kubeflow", V2_KUBEFLOW), ("frameworkcontroller", V2_FC)])
def test_dry_run_objects_pass_server_side_validation(kube_crd_ns, tmp_path, platform, text):
    from kubernetes import client

    kube = kube_crd_ns  # NNI's configs name no namespace: "default", where a dry run stores nothing
    cfg = _load(tmp_path, text, "config.yml")
    dry = backend_class(platform)(cfg).render()
    kinds = [o["kind"] for o in dry.requests]
    main_kind = "TFJob" if platform == "kubeflow" else "Framework"
    # NNI's configs name no nniManagerIp: the hub relay comes first (hubTunnel), then, for
    # frameworkcontroller, the barrier's read access for its account
    access_kinds = [] if platform == "kubeflow" else ["Role", "RoleBinding"]
    assert kinds == ["ConfigMap", "Pod", "Service", "ConfigMap", *access_kinds, "Secret", main_kind], kinds
    relay, access_objects, (secret, main) = dry.requests[:3], dry.requests[4:-2], dry.requests[-2:]
    agent_map = dry.requests[3]
    assert agent_map["metadata"]["name"].startswith("nni-agent-")
    for obj in access_objects:
        assert obj["subjects" if obj["kind"] == "RoleBinding" else "rules"], obj
    assert main["metadata"]["name"] in dry.text
    api = kube.api_client()
    config_map, relay_pod, service = relay
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(NS, config_map, dry_run="All", field_validation="Strict")
    core.create_namespaced_config_map(NS, agent_map, dry_run="All", field_validation="Strict")
    core.create_namespaced_pod(NS, relay_pod, dry_run="All", field_validation="Strict")
    core.create_namespaced_service(NS, service, dry_run="All", field_validation="Strict")
    created = client.CoreV1Api(api).create_namespaced_secret(NS, secret, dry_run="All", field_validation="Strict")
    assert created.metadata.name == secret["metadata"]["name"]
    group, version = main["apiVersion"].split("/")
    plural = "tfjobs" if platform == "kubeflow" else "frameworks"
    accepted = client.CustomObjectsApi(api).create_namespaced_custom_object(
        group, version, NS, plural, main, dry_run="All", field_validation="Strict")
    assert accepted["kind"] == main_kind
    # a dry run stores nothing
    assert client.CustomObjectsApi(api).list_namespaced_custom_object(group, version, NS, plural)["items"] == []
    assert not [s for s in client.CoreV1Api(api).list_namespaced_secret(NS).items
                if s.metadata.name == secret["metadata"]["name"]]
    # NNI's storage is mounted where NNI mounted it, in every pod
    if platform == "kubeflow":
        templates = [s["template"] for s in main["spec"]["tfReplicaSpecs"].values()]
        assert sorted(main["spec"]["tfReplicaSpecs"]) == ["PS", "Worker"]
    else:
        templates = [r["task"]["pod"] for r in main["spec"]["taskRoles"]]
        policies = {r["name"]: r["frameworkAttemptCompletionPolicy"] for r in main["spec"]["taskRoles"]}
        assert policies == {"worker": {"minFailedTaskCount": 1, "minSucceededTaskCount": 1},
                            "ps": {"minFailedTaskCount": 1, "minSucceededTaskCount": -1}}
    assert len(templates) == 2
    for t in templates:
        spec = t["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = [m for c in spec["containers"] for m in c["volumeMounts"] if m["mountPath"] == "/tmp/mount"]
        assert len(mounts) == 1, spec["containers"]
        assert volumes[mounts[0]["name"]]["nfs"] == {"server": "nfs.example.org", "path": "/var/nfs/general"}
        if platform == "frameworkcontroller":
            assert spec["serviceAccountName"] == "frameworkcontroller"
        # the token is never in the spec
        assert "NNI_AGENT_TOKEN" not in json.dumps(spec)


def test_kubeflow_role_code_directory_is_the_trial_code(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "other").mkdir()

    def load(worker_code: str, ps_code: str) -> Any:
        return load_config({"trialConcurrency": 1, "trainingService": {
            "platform": "kubeflow", "operator": "tf-operator", "apiVersion": "v1",
            "worker": {"replicas": 1, "command": "python3 train.py", "cpuNumber": 1, "memorySize": 512,
                       "codeDirectory": worker_code},
            "ps": {"replicas": 1, "command": "python3 ps.py", "cpuNumber": 1, "memorySize": 512,
                   "codeDirectory": ps_code}}}, base_dir=tmp_path)

    assert load("src", "./src").trial_code_directory == tmp_path / "src"  # NNI's roles name the shipped code
    with pytest.raises(ConfigError) as info:
        load("src", "other")
    assert info.value.field == "trainingService.ps.codeDirectory" and "same codeDirectory" in info.value.fix
