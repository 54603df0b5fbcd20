"""Custom resources of the Kubernetes emulator: CRD validation, training-operator (TFJob, PyTorchJob)
and FrameworkController (+ frameworkbarrier), driven through the official kubernetes client."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from tests.support.kube.emulator import barrier, crds
from tests.support.kube.fixtures import namespace_of
from tests.support.schemas import SchemasMissing

PY = "nni-test/python:3.11"
KF = ("kubeflow.org", "v1")
FC = ("frameworkcontroller.microsoft.com", "v1")


def _examples():
    try:
        examples = crds.schemas_dir() / "examples"
    except SchemasMissing as e:  # collected all the same, and skipped with the reason
        return [pytest.param(None, id="published-examples", marks=pytest.mark.skip(reason=str(e)))]
    out = []
    for f in sorted(examples.glob("*/*.yaml")):
        for i, d in enumerate(yaml.safe_load_all(f.read_text())):
            if d and d.get("kind") in ("TFJob", "PyTorchJob", "Framework"):
                out.append(pytest.param(d, id=f"{f.stem}-{i}"))
    return out


RES = {"TFJob": crds.TFJOBS, "PyTorchJob": crds.PYTORCHJOBS, "Framework": crds.FRAMEWORKS}


# ----------------------------------------------------------------------------- 1. validation (no emulator)

def test_schemas_located_outside_repo():
    d = crds.schemas_dir()
    assert (d / "kubeflow" / "tfjob-v1.schema.json").is_file()
    assert Path(__file__).resolve().parents[2] not in d.resolve().parents


def test_schemas_missing_gives_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv(crds.SCHEMAS_ENV, str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="NNI_SHARED_SCHEMAS"):
        crds.schemas_dir()


@pytest.mark.parametrize("obj", _examples())
def test_published_examples_are_valid(obj):
    v = crds.validator_for(RES[obj["kind"]])
    errs = v(copy.deepcopy(obj), "Strict")
    assert errs == []


def _tf_example():
    p = crds.schemas_dir() / "examples/training-operator/examples__tensorflow__simple.yaml"
    return yaml.safe_load(p.read_text())


def test_wrong_type_is_invalid_with_apiserver_wording():
    obj = _tf_example()
    obj["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = "two"
    errs = crds.validator_for(crds.TFJOBS)(obj, "Strict")
    assert [(e.field, e.reason) for e in errs] == [("spec.tfReplicaSpecs.Worker.replicas", "FieldValueTypeInvalid")]
    assert errs[0].message == ('Invalid value: "string": spec.tfReplicaSpecs.Worker.replicas in body '
                               'must be of type integer: "string"')


def test_nested_list_path_and_required():
    obj = _tf_example()
    c = obj["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    c["ports"] = [{"containerPort": "x"}]
    del c["name"]
    errs = {e.field: e for e in crds.validator_for(crds.TFJOBS)(obj, "Warn")}
    base = "spec.tfReplicaSpecs.Worker.template.spec.containers[0]"
    assert errs[base + ".name"].reason == "FieldValueRequired"
    assert errs[base + ".ports[0].containerPort"].reason == "FieldValueTypeInvalid"


def test_unknown_field_strict_warn_ignore():
    from tests.support.kube.emulator.api import ApiError
    obj = _tf_example()
    obj["spec"]["foo"] = 1
    v = crds.validator_for(crds.TFJOBS)
    with pytest.raises(ApiError) as ei:
        v(copy.deepcopy(obj), "Strict")
    assert ei.value.code == 400 and ei.value.message == 'strict decoding error: unknown field "spec.foo"'
    warned = copy.deepcopy(obj)
    assert v(warned, "Warn") == [] and "foo" not in warned["spec"]
    assert v.warnings == ['unknown field "spec.foo"']
    ignored = copy.deepcopy(obj)
    assert v(ignored, "Ignore") == [] and "foo" not in ignored["spec"] and v.warnings == []


def test_preserve_unknown_fields_keeps_pod_template_of_framework():
    obj = yaml.safe_load((crds.schemas_dir() / "examples/frameworkcontroller/"
                          "example__framework__basic__batchsucceeded.yaml").read_text())
    obj["spec"]["taskRoles"][0]["task"]["pod"]["spec"]["madeUp"] = 1
    assert crds.validator_for(crds.FRAMEWORKS)(obj, "Strict") == []
    assert obj["spec"]["taskRoles"][0]["task"]["pod"]["spec"]["madeUp"] == 1


def test_bad_names_labels_and_enum():
    obj = _tf_example()
    obj["metadata"]["name"] = "Bad_Name"
    obj["metadata"]["labels"] = {"ok": "bad value!"}
    errs = crds.validator_for(crds.TFJOBS)(obj, "Strict")
    assert [(e.field, e.reason) for e in errs] == [("metadata.name", "FieldValueInvalid"),
                                                     ("metadata.labels", "FieldValueInvalid")]
    assert "a lowercase RFC 1123 subdomain" in errs[0].message
    fw = yaml.safe_load((crds.schemas_dir() / "examples/frameworkcontroller/"
                         "example__framework__basic__batchsucceeded.yaml").read_text())
    fw["metadata"]["name"] = "with-dash"           # Framework names: ^[a-z0-9]{1,63}$
    fw["spec"]["executionType"] = "Run"
    fw["spec"]["taskRoles"][0]["taskNumber"] = -1
    errs = {e.field: e for e in crds.validator_for(crds.FRAMEWORKS)(fw, "Strict")}
    assert errs["metadata.name"].message.endswith("metadata.name in body should match '^[a-z0-9]{1,63}$'")
    assert errs["spec.executionType"].reason == "FieldValueNotSupported"
    assert errs["spec.executionType"].message == 'Unsupported value: "Run": supported values: "Create", "Start", "Stop"'
    assert "should be greater than or equal to 0" in errs["spec.taskRoles[0].taskNumber"].message


def test_schema_defaults_applied():
    obj = _tf_example()
    obj["spec"]["runPolicy"] = {"cleanPodPolicy": "All"}
    assert crds.validator_for(crds.TFJOBS)(obj, "Strict") == []
    assert obj["spec"]["runPolicy"]["suspend"] is False


def test_injector_script_format():
    f = {"spec": {"taskRoles": [{"name": "server", "taskNumber": 2}]},
         "status": {"attemptStatus": {"taskRoleStatuses": [{"name": "server", "taskStatuses": [
             {"index": 0, "attemptStatus": {"podIP": "127.0.0.11"}},
             {"index": 1, "attemptStatus": {"podIP": "127.0.0.12"}}]}]}}}
    assert barrier.is_barrier_passed(f)
    s = barrier.generate_injector(f)
    assert "export FB_SERVER_IPS=127.0.0.11,127.0.0.12\n" in s
    assert "export FB_SERVER_ADDRESSES=127.0.0.11:${FB_SERVER_PORT},127.0.0.12:${FB_SERVER_PORT}\n" in s
    f["status"]["attemptStatus"]["taskRoleStatuses"][0]["taskStatuses"][1]["attemptStatus"]["podIP"] = None
    assert not barrier.is_barrier_passed(f)
    assert barrier.is_barrier_image("frameworkcontroller/frameworkbarrier:v1.0.1")
    assert not barrier.is_barrier_image("frameworkcontroller/frameworkcontroller")


# ----------------------------------------------------------------------------- emulator helpers

@pytest.fixture
def kf(kube_crd_ns):
    """The shared emulator with both operators; this test's objects in its own namespace (`namespace_of`)."""
    # the barrier reads its Framework as the pod's account (RBAC)
    grant_framework_reads(kube_crd_ns, "default", kube_crd_ns.namespace)
    return kube_crd_ns


def grant_framework_reads(k, account, ns="default"):
    """What a cluster admin applies for FrameworkController's barrier: get/list/watch frameworks."""
    from kubernetes import client
    rbac = client.RbacAuthorizationV1Api(k.api_client())
    rbac.create_namespaced_role(ns, {"metadata": {"name": "fb-read"}, "rules": [
        {"apiGroups": [FC[0]], "resources": ["frameworks"], "verbs": ["get", "list", "watch"]}]})
    rbac.create_namespaced_role_binding(ns, {"metadata": {"name": f"fb-read-{account}"},
                                             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                         "name": "fb-read"},
                                             "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}]})


def custom(k):
    from kubernetes import client
    return client.CustomObjectsApi(k.api_client())


def get_job(k, plural, name):
    return custom(k).get_namespaced_custom_object(*KF, namespace_of(k), plural, name)


def cond_types(job, status="True"):
    return [c["type"] for c in (job.get("status") or {}).get("conditions") or [] if c["status"] == status]


def pod_env(pod, container):
    c = next(c for c in pod.spec.containers if c.name == container)
    return {e.name: e.value for e in c.env or []}


def wait_cond(k, plural, name, ctype, timeout=30):
    return k.wait_for(lambda: (lambda j: j if ctype in cond_types(j) else None)(get_job(k, plural, name)),
                      timeout=timeout, what=f"{name} {ctype}")


def replica(cmd, restart="Never", replicas=1, container="tensorflow"):
    return {"replicas": replicas, "restartPolicy": restart,
            "template": {"spec": {"containers": [{"name": container, "image": PY, "command": ["sh", "-c", cmd]}]}}}


def test_old_api_versions_not_served(kf):
    from kubernetes.client.rest import ApiException
    api = custom(kf)
    for version in ("v1alpha2", "v1beta2"):
        with pytest.raises(ApiException) as ei:
            api.list_namespaced_custom_object("kubeflow.org", version, namespace_of(kf), "tfjobs")
        assert ei.value.status == 404
    obj = _tf_example()
    obj["metadata"] = {"name": "bad"}
    obj["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = "two"
    with pytest.raises(ApiException) as ei:
        api.create_namespaced_custom_object(*KF, namespace_of(kf), "tfjobs", obj)
    assert ei.value.status == 422
    body = json.loads(ei.value.body)
    assert body["reason"] == "Invalid"
    assert body["message"].startswith('TFJob.kubeflow.org "bad" is invalid: spec.tfReplicaSpecs.Worker.replicas')


def test_tfjob_succeeds_with_tf_config_and_clean_pod_policy(kf):
    core = kf.core()
    job = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "mnist"},
           "spec": {"runPolicy": {"cleanPodPolicy": "Running"},
                    "tfReplicaSpecs": {"PS": replica("sleep 60"),
                                       "Worker": replica('echo "$TF_CONFIG"; sleep 1', replicas=2)}}}
    custom(kf).create_namespaced_custom_object(*KF, namespace_of(kf), "tfjobs", job)
    pods = kf.wait_for(lambda: (lambda ps: ps if len(ps) == 3 else None)(
        {p.metadata.name: p for p in core.list_namespaced_pod(namespace_of(kf)).items}), what="3 pods")
    done = wait_cond(kf, "tfjobs", "mnist", "Succeeded")
    assert done["status"]["conditions"][-1]["reason"] == "TFJobSucceeded"
    assert done["status"]["conditions"][-1]["message"] == f"TFJob {namespace_of(kf)}/mnist successfully completed."
    assert "completionTime" in done["status"] and "startTime" in done["status"]
    hist = [cond_types({"status": s}, "True") for s in (kf.history("tfjobs", namespace_of(kf), "mnist") or [])]
    seen = [t for h in hist for t in h]
    assert "Created" in seen and "Running" in seen
    assert cond_types(done, "False") == ["Running"]
    w0 = pods["mnist-worker-0"]
    labels = w0.metadata.labels
    assert labels["training.kubeflow.org/job-name"] == "mnist"
    assert labels["training.kubeflow.org/operator-name"] == "tfjob-controller"
    assert labels["training.kubeflow.org/replica-type"] == "worker"
    assert labels["training.kubeflow.org/replica-index"] == "0"
    assert labels["training.kubeflow.org/job-role"] == "master"
    ref = w0.metadata.owner_references[0]
    assert (ref.kind, ref.name, ref.controller, ref.block_owner_deletion) == ("TFJob", "mnist", True, True)
    tf = json.loads(pod_env(w0, "tensorflow")["TF_CONFIG"])
    assert tf == {"cluster": {"ps": [f"mnist-ps-0.{namespace_of(kf)}.svc:2222"],
                              "worker": [f"mnist-worker-0.{namespace_of(kf)}.svc:2222", f"mnist-worker-1.{namespace_of(kf)}.svc:2222"]},
                  "task": {"type": "worker", "index": 0}, "environment": "cloud"}
    assert json.loads(core.read_namespaced_pod_log("mnist-worker-0", namespace_of(kf)).strip()) == tf
    w1 = json.loads(pod_env(pods["mnist-worker-1"], "tensorflow")["TF_CONFIG"])
    ps = json.loads(pod_env(pods["mnist-ps-0"], "tensorflow")["TF_CONFIG"])
    assert ps["task"] == {"type": "ps", "index": 0} and ps["cluster"] == tf["cluster"]
    assert w1["task"] == {"type": "worker", "index": 1}
    svc = core.read_namespaced_service("mnist-worker-0", namespace_of(kf))   # finished pods keep theirs
    assert svc.spec.cluster_ip == "None" and svc.spec.ports[0].port == 2222
    assert svc.spec.ports[0].name == "tfjob-port"
    assert svc.spec.selector["training.kubeflow.org/replica-index"] == "0"
    # cleanPodPolicy Running: the still-running PS pod is deleted, the finished worker 0 stays
    kf.wait_for(lambda: not any(p.metadata.name == "mnist-ps-0"
                                for p in core.list_namespaced_pod(namespace_of(kf)).items), what="ps deleted")
    assert core.read_namespaced_pod("mnist-worker-0", namespace_of(kf)).status.phase == "Succeeded"
    final = get_job(kf, "tfjobs", "mnist")
    assert final["status"]["replicaStatuses"]["Worker"] == {"succeeded": 2}   # active ones counted as succeeded


def test_tfjob_worker_failure_fails_job(kf):
    job = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "bad"},
           "spec": {"tfReplicaSpecs": {"Worker": replica("exit 1", replicas=2)}}}
    custom(kf).create_namespaced_custom_object(*KF, namespace_of(kf), "tfjobs", job)
    done = wait_cond(kf, "tfjobs", "bad", "Failed")
    failed = [c for c in done["status"]["conditions"] if c["type"] == "Failed"][0]
    assert failed["reason"] == "TFJobFailed"
    assert failed["message"] in (f"TFJob {namespace_of(kf)}/bad has failed because 1 Worker replica(s) failed.",
                                 f"TFJob {namespace_of(kf)}/bad has failed because 2 Worker replica(s) failed.")
    assert "Succeeded" not in cond_types(done)


def test_pytorchjob_env(kf):
    core = kf.core()
    cmd = 'echo "$MASTER_ADDR $MASTER_PORT $WORLD_SIZE $RANK"'
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "pt"},
           "spec": {"pytorchReplicaSpecs": {
               "Master": replica(cmd + "; sleep 0.3", restart="OnFailure", container="pytorch"),
               "Worker": replica(cmd, restart="OnFailure", replicas=2, container="pytorch")}}}
    custom(kf).create_namespaced_custom_object(*KF, namespace_of(kf), "pytorchjobs", job)
    done = wait_cond(kf, "pytorchjobs", "pt", "Succeeded")
    assert done["status"]["conditions"][-1]["message"] == "PyTorchJob pt is successfully completed."
    for name, rank in (("pt-master-0", 0), ("pt-worker-0", 1), ("pt-worker-1", 2)):
        pod = core.read_namespaced_pod(name, namespace_of(kf))
        env = pod_env(pod, "pytorch")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"], env["RANK"]) == \
            ("pt-master-0", "23456", "3", str(rank))
        assert env["PYTHONUNBUFFERED"] == "1" and env["PET_NNODES"] == "3"
        assert core.read_namespaced_pod_log(name, namespace_of(kf)).split() == ["pt-master-0", "23456", "3", str(rank)]
    assert core.read_namespaced_pod("pt-master-0", namespace_of(kf)).metadata.labels[
        "training.kubeflow.org/job-role"] == "master"


def test_training_operator_webhook_rules(kf):
    """The operator's validating webhooks: PyTorchJob Master replicas must be 1, its replica types are
    Master / Worker; a TFJob has at most one Chief or Master role."""
    from kubernetes.client.exceptions import ApiException
    cmd = "true"
    cases = [
        ("pytorchjobs", "PyTorchJob", "pytorchReplicaSpecs",
         {"Master": replica(cmd, replicas=2, container="pytorch")},
         "spec.pytorchReplicaSpecs[Master].replicas: Forbidden: must be 1"),
        ("pytorchjobs", "PyTorchJob", "pytorchReplicaSpecs",
         {"Master": replica(cmd, container="pytorch"), "Worker": replica(cmd, container="main")},
         "spec.pytorchReplicaSpecs[Worker].template.spec.containers: Required value: There is no container named "
         "pytorch in Worker"),
        ("tfjobs", "TFJob", "tfReplicaSpecs", {"Chief": replica(cmd), "Master": replica(cmd)},
         "spec.tfReplicaSpecs: Forbidden: must not have more than 1 Chief or Master role"),
    ]
    for plural, kind, key, specs, expected in cases:
        job = {"apiVersion": "kubeflow.org/v1", "kind": kind, "metadata": {"name": "hook"}, "spec": {key: specs}}
        with pytest.raises(ApiException) as e:
            custom(kf).create_namespaced_custom_object(*KF, namespace_of(kf), plural, job)
        body = json.loads(e.value.body)
        assert e.value.status == 422 and body["reason"] == "Invalid", body
        assert body["message"].startswith(f'admission webhook "validator.{kind.lower()}.training-operator.kubeflow.org" '
                                          f'denied the request: {kind}.kubeflow.org "hook" is invalid: '), body
        assert expected in body["message"], body["message"]
    ok = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "hook"},
          "spec": {"pytorchReplicaSpecs": {"Master": replica(cmd, container="pytorch")}}}
    assert custom(kf).create_namespaced_custom_object(*KF, namespace_of(kf), "pytorchjobs", ok)["metadata"]["name"] == "hook"


def test_deleting_job_deletes_pods(kf):
    core = kf.core()
    job = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "long"},
           "spec": {"tfReplicaSpecs": {"Worker": replica("sleep 60", replicas=2)}}}
    custom(kf).create_namespaced_custom_object(*KF, namespace_of(kf), "tfjobs", job)
    wait_cond(kf, "tfjobs", "long", "Running")
    kf.wait_for(lambda: all(kf.pod_processes(namespace_of(kf), f"long-worker-{i}") for i in range(2)), what="processes")
    custom(kf).delete_namespaced_custom_object(*KF, namespace_of(kf), "tfjobs", "long")
    kf.wait_for(lambda: not core.list_namespaced_pod(namespace_of(kf)).items
                and not [s for s in core.list_namespaced_service(namespace_of(kf)).items if s.metadata.name.startswith("long")],
                timeout=40, what="pods and services gone")
    kf.wait_for(lambda: not kf.leftover_processes(), what="no processes")


# ----------------------------------------------------------------------------- FrameworkController

def task_role(name, n, cmd, min_failed=1, min_succeeded=-1, barrier_init=True):
    spec = {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": PY, "command": ["sh", "-c", cmd]}]}
    if barrier_init:
        spec["containers"][0]["volumeMounts"] = [{"name": "frameworkbarrier-volume",
                                                  "mountPath": "/mnt/frameworkbarrier"}]
        spec["initContainers"] = [{"name": "frameworkbarrier", "image": "frameworkcontroller/frameworkbarrier",
                                   "volumeMounts": [{"name": "frameworkbarrier-volume",
                                                     "mountPath": "/mnt/frameworkbarrier"}]}]
        spec["volumes"] = [{"name": "frameworkbarrier-volume", "emptyDir": {}}]
    return {"name": name, "taskNumber": n,
            "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": min_failed,
                                                 "minSucceededTaskCount": min_succeeded},
            "task": {"retryPolicy": {"fancyRetryPolicy": False, "maxRetryCount": 0},
                     "podGracefulDeletionTimeoutSec": 600, "pod": {"spec": spec}}}


def framework(name, roles, execution="Start"):
    return {"apiVersion": "frameworkcontroller.microsoft.com/v1", "kind": "Framework",
            "metadata": {"name": name},
            "spec": {"executionType": execution, "retryPolicy": {"fancyRetryPolicy": True, "maxRetryCount": 0},
                     "taskRoles": roles}}


def get_fw(k, name):
    return custom(k).get_namespaced_custom_object(*FC, namespace_of(k), "frameworks", name)


def wait_fw_state(k, name, state, timeout=40):
    return k.wait_for(lambda: (lambda f: f if (f.get("status") or {}).get("state") == state else None)(get_fw(k, name)),
                      timeout=timeout, what=f"framework {name} {state}")


def test_framework_barrier_and_succeeded_policy(kf):
    core = kf.core()
    inject = ("FB_SERVER_PORT=4001 FB_WORKER_PORT=5001 . /mnt/frameworkbarrier/injector.sh >/dev/null && "
              "echo IPS=$FB_SERVER_IPS ADDR=$FB_WORKER_ADDRESSES IDX=$FC_TASK_INDEX")
    fw = framework("fb", [task_role("server", 1, inject + "; sleep 60", min_failed=1),
                          task_role("worker", 2, inject + "; sleep 0.3", min_failed=1, min_succeeded=1)])
    custom(kf).create_namespaced_custom_object(*FC, namespace_of(kf), "frameworks", fw)
    wait_fw_state(kf, "fb", "AttemptRunning")
    done = wait_fw_state(kf, "fb", "Completed")
    st = done["status"]
    cs = st["attemptStatus"]["completionStatus"]
    assert (cs["code"], cs["phrase"], cs["type"]["name"]) == (0, "Succeeded", "Succeeded")
    assert cs["trigger"]["taskRoleName"] == "worker"
    assert cs["trigger"]["message"] == "SucceededTaskCount 1 has reached MinSucceededTaskCount 1 in the TaskRole"
    assert st["completionTime"] and st["attemptStatus"]["configMapName"] == "fb-attempt"
    roles = {r["name"]: r for r in st["attemptStatus"]["taskRoleStatuses"]}
    server = roles["server"]["taskStatuses"][0]
    assert server["state"] == "TaskCompleted"
    assert server["attemptStatus"]["completionStatus"]["code"] == -220   # stopped with the attempt
    assert server["attemptStatus"]["podName"] == "fb-server-0"
    kf.wait_for(lambda: not [p for p in core.list_namespaced_pod(namespace_of(kf)).items
                             if p.metadata.name.startswith("fb-")], what="framework pods deleted")
    assert not [c for c in core.list_namespaced_config_map(namespace_of(kf)).items if c.metadata.name == "fb-attempt"]


def test_framework_barrier_env_and_pod_shape(kf):
    core = kf.core()
    inject = ("FB_SERVER_PORT=4001 FB_WORKER_PORT=5001 . /mnt/frameworkbarrier/injector.sh >/dev/null && "
              "echo IPS=$FB_SERVER_IPS ADDR=$FB_WORKER_ADDRESSES IDX=$FC_TASK_INDEX; sleep 60")
    fw = framework("shape", [task_role("server", 1, inject), task_role("worker", 2, inject)])
    custom(kf).create_namespaced_custom_object(*FC, namespace_of(kf), "frameworks", fw)
    kf.wait_for(lambda: "IPS=" in _log(core, "shape-worker-1", namespace_of(kf)), what="barrier output")
    assert _log(core, "shape-worker-1", namespace_of(kf)).strip() == \
        "IPS=127.0.0.1 ADDR=127.0.0.1:5001,127.0.0.1:5001 IDX=1"
    pod = core.read_namespaced_pod("shape-worker-1", namespace_of(kf))
    env = pod_env(pod, "main")
    f = get_fw(kf, "shape")
    assert env["FC_FRAMEWORK_NAME"] == "shape" and env["FC_TASKROLE_NAME"] == "worker"
    assert env["FC_TASK_INDEX"] == "1" and env["FC_CONFIGMAP_NAME"] == "shape-attempt"
    assert env["FC_FRAMEWORK_UID"] == f["metadata"]["uid"] and env["FC_FRAMEWORK_ATTEMPT_ID"] == "0"
    assert env["FC_POD_NAME"] == "shape-worker-1" and env["FC_TASK_ATTEMPT_ID"] == "0"
    assert pod.metadata.labels["FC_TASKROLE_NAME"] == "worker"
    cm = core.read_namespaced_config_map("shape-attempt", namespace_of(kf))
    assert cm.metadata.owner_references[0].uid == f["metadata"]["uid"]
    assert pod.metadata.owner_references[0].kind == "ConfigMap"
    assert pod.metadata.owner_references[0].uid == cm.metadata.uid
    assert env["FC_CONFIGMAP_UID"] == cm.metadata.uid
    # executionType Stop: pods deleted, completion code -210
    custom(kf).patch_namespaced_custom_object(*FC, namespace_of(kf), "frameworks", "shape",
                                              {"spec": {"executionType": "Stop"}})
    done = wait_fw_state(kf, "shape", "Completed")
    cs = done["status"]["attemptStatus"]["completionStatus"]
    assert (cs["code"], cs["phrase"], cs["diagnostics"]) == (-210, "StopFrameworkRequested",
                                                             "User has requested to stop the Framework")
    assert cs["type"] == {"name": "Failed", "attributes": ["Permanent"]}
    assert not [p for p in core.list_namespaced_pod(namespace_of(kf)).items if p.metadata.name.startswith("shape-")]
    kf.wait_for(lambda: not kf.leftover_processes(), what="no processes")


def _log(core, name, ns):
    try:
        return core.read_namespaced_pod_log(name, ns)
    except Exception:
        return ""


def test_framework_failed_policy_names_task(kf):
    fw = framework("ff", [task_role("ps", 1, "sleep 60", barrier_init=False),
                          task_role("worker", 2, 'if [ "$FC_TASK_INDEX" = 1 ]; then exit 3; fi; sleep 60',
                                    barrier_init=False)])
    custom(kf).create_namespaced_custom_object(*FC, namespace_of(kf), "frameworks", fw)
    done = wait_fw_state(kf, "ff", "Completed")
    cs = done["status"]["attemptStatus"]["completionStatus"]
    assert (cs["code"], cs["phrase"], cs["type"]["name"]) == (3, "ContainerUnrecognizedFailed", "Failed")
    assert cs["trigger"] == {"message": "FailedTaskCount 1 has reached MinFailedTaskCount 1 in the TaskRole",
                             "taskRoleName": "worker", "taskIndex": 1}
    assert cs["diagnostics"].startswith("Pod failed: PodPattern unmatched:")


def test_deleting_framework_deletes_pods(kf):
    core = kf.core()
    fw = framework("gone", [task_role("worker", 2, "sleep 60", barrier_init=False)])
    custom(kf).create_namespaced_custom_object(*FC, namespace_of(kf), "frameworks", fw)
    wait_fw_state(kf, "gone", "AttemptRunning")
    kf.wait_for(lambda: kf.leftover_processes(), what="processes")
    custom(kf).delete_namespaced_custom_object(*FC, namespace_of(kf), "frameworks", "gone")
    kf.wait_for(lambda: not [p for p in core.list_namespaced_pod(namespace_of(kf)).items
                             if p.metadata.name.startswith("gone-")], timeout=40, what="pods gone")
    kf.wait_for(lambda: not [c for c in core.list_namespaced_config_map(namespace_of(kf)).items
                             if c.metadata.name == "gone-attempt"], what="configmap gone")
    kf.wait_for(lambda: not kf.leftover_processes(), what="no processes")
