"""Kubeflow Trainer v2 for platform kubeflow (`operator: trainer`): one TrainJob
(trainer.kubeflow.org/v1alpha1) per environment, referencing a ClusterTrainingRuntime.

New Kubeflow installs serve TrainJob, not TFJob/PyTorchJob. The runtime (the cluster's, e.g.
`torch-distributed`) owns the pod template; a TrainJob may only set `spec.trainer` (image,
command, env, numNodes, resourcesPerNode) and `runtimePatches` (Trainer >= v2.2: the pods'
labels, annotations, volumes, the container's volumeMounts/env/securityContext, pull secrets,
scheduling). So the agent's pod is split across both: its container in `spec.trainer`, its
Secret / wheel volumes and the experiment's labels in a runtime patch on the `node` job.

The Trainer runs the TrainJob as a JobSet of Indexed Jobs: pod names end in a random suffix,
so the agent's id is `<trainjob>-node-0-<completion index>` (set from `JOB_COMPLETION_INDEX` in
the command, found again from the pod's labels).
"""
from __future__ import annotations

import copy
from typing import Any

from nni_manager.backends.jobs import StateTable
from nni_manager.backends.kubernetes.client import KubeError, api_error

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
OPERATOR = "trainer"  # the `operator` value that names Trainer v2
DEFAULT_RUNTIME = "torch-distributed"
NODE = "node"  # the Trainer's trainer job and container (constants.Node)
PATCH_MANAGER = "nni-manager"
INSTALL = "https://www.kubeflow.org/docs/components/trainer/operator-guides/installation/"
RUNTIMES = 'kubectl apply --server-side -k "https://github.com/kubeflow/trainer.git/manifests/overlays/runtimes?ref=v2.3.0"'

# metav1 conditions, replaced in place: Complete / Failed (copied from the JobSet), Suspended.
# No condition yet: the JobSet runs (the Trainer has no Running condition).
STATES = StateTable.of(running=[""], succeeded=["Complete"], failed=["Failed"], stopped=["Suspended"])

# What a runtime patch can carry to the pods (PodSpecPatch, ContainerPatch of v2.3.0)
_POD_PATCH = ("serviceAccountName", "volumes", "imagePullSecrets", "securityContext", "nodeSelector", "affinity",
              "tolerations", "schedulingGates", "terminationGracePeriodSeconds")
_CONTAINER_PATCH = ("env", "volumeMounts", "securityContext")
# set by the agent's pod template and dropped: the runtime (JobSet) decides them
_DROPPED_POD = ("restartPolicy", "containers")
_DROPPED_CONTAINER = ("name", "image", "command", "resources", "terminationMessagePolicy")


def custom(api_version: str) -> tuple[str, str, str, str]:
    return GROUP, api_version, "trainjobs", "TrainJob"


def agent_id(object_name: str, index: int) -> str:
    """The agent of the TrainJob's `index`-th node: its pod's name without the Job's random suffix."""
    return f"{object_name}-{NODE}-0-{index}"


def agent_prefix(object_name: str) -> str:
    """Shell run before the boot step: the agent's id from the Job's completion index."""
    return f'export NNI_AGENT_ID="{object_name}-{NODE}-0-$JOB_COMPLETION_INDEX"'


def agent_of_pod(pod: dict[str, Any]) -> str:
    """The agent a TrainJob's pod runs, from JobSet's and the Job's labels (else its name)."""
    md = pod.get("metadata") or {}
    lb = md.get("labels") or {}
    keys = ("jobset.sigs.k8s.io/jobset-name", "jobset.sigs.k8s.io/replicatedjob-name",
            "jobset.sigs.k8s.io/job-index", "batch.kubernetes.io/job-completion-index")
    if all(k in lb for k in keys):
        return "-".join(str(lb[k]) for k in keys)
    return str(md.get("name", ""))


def state_of(obj: dict[str, Any]) -> str:
    """Failed, Complete or Suspended when true; "" while the JobSet runs."""
    true = {c.get("type") for c in (obj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
    return next((t for t in ("Failed", "Complete", "Suspended") if t in true), "")


def main_object(template: dict[str, Any], replicas: int, runtime: str, api_version: str,
                meta: dict[str, Any]) -> dict[str, Any]:
    """The TrainJob for the agent pod `template` (objects.pod_template, container `node`) on
    `replicas` nodes. A podSpec field no runtime patch can carry is refused in one line."""
    spec = copy.deepcopy(template["spec"])
    c = spec["containers"][0]
    lost = [f"podSpec.{k}" for k in spec if k not in _POD_PATCH + _DROPPED_POD]
    lost += [f"podSpec.containers[].{k}" for k in c if k not in _CONTAINER_PATCH + _DROPPED_CONTAINER]
    lost += [f"podSpec.containers[{x.get('name', '')}]" for x in spec["containers"][1:]]
    if lost:
        raise KubeError(f"{', '.join(sorted(lost))}: a TrainJob cannot set it on its pods (Kubeflow Trainer's "
                        f"runtimePatches carry only {', '.join(_POD_PATCH)} and the container's "
                        f"{', '.join(_CONTAINER_PATCH)}): remove it, or set it in the ClusterTrainingRuntime {runtime}")
    trainer = {"image": c["image"], "command": c["command"], "numNodes": replicas,
               "resourcesPerNode": c["resources"],
               "env": [e for e in c.get("env") or [] if e["name"] != "NNI_AGENT_ID"]}  # set by agent_prefix
    container_patch: dict[str, Any] = {"name": NODE, **{k: c[k] for k in _CONTAINER_PATCH if k in c and k != "env"}}
    pod_patch = {k: spec[k] for k in _POD_PATCH if k in spec}
    pod_patch["containers"] = [container_patch]
    patch = {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
        "name": NODE, "template": {"spec": {"template": {"metadata": template["metadata"], "spec": pod_patch}}}}]}}}}
    return {"apiVersion": f"{GROUP}/{api_version}", "kind": "TrainJob", "metadata": meta,
            "spec": {"runtimeRef": {"name": runtime, "apiGroup": GROUP, "kind": "ClusterTrainingRuntime"},
                     "trainer": trainer, "runtimePatches": [patch]}}


async def check_runtime(custom_api: Any, name: str, api_version: str) -> None:
    """The ClusterTrainingRuntime exists, or one line naming those that do. A user who may not
    read cluster-scoped runtimes is not refused here (the Trainer's webhook checks at create)."""
    try:
        await custom_api.get_cluster_custom_object(GROUP, api_version, "clustertrainingruntimes", name)
        return
    except Exception as e:
        if getattr(e, "status", None) in (401, 403):
            return
        if getattr(e, "status", None) != 404:
            raise api_error(e, f"reading ClusterTrainingRuntime {name}") from None
    try:
        listed = await custom_api.list_cluster_custom_object(GROUP, api_version, "clustertrainingruntimes")
        names = sorted(o["metadata"]["name"] for o in listed.get("items", []))
    except Exception:
        names = []
    if not names:
        raise KubeError(f"trainingService.trainingRuntime: ClusterTrainingRuntime {name!r} does not exist and this "
                        f"cluster has none: install Kubeflow Trainer's runtimes ({RUNTIMES})")
    raise KubeError(f"trainingService.trainingRuntime: ClusterTrainingRuntime {name!r} does not exist (this cluster "
                    f"has {', '.join(names)}): set trainingRuntime to one of them")


async def served(custom_api: Any, namespace: str, group: str, version: str, plural: str) -> bool:
    """Whether the cluster serves the kind (False only on the API server's 404)."""
    try:
        await custom_api.list_namespaced_custom_object(group, version, namespace, plural, limit=1)
    except Exception as e:
        return getattr(e, "status", None) != 404
    return True


async def unserved_line(custom_api: Any, namespace: str, kind: str, wanted: tuple[str, str]) -> str:
    """Why the configured kind (`wanted`: group, version) is not served, and which operator to
    install or which `operator` to set, in one line."""
    v1 = await served(custom_api, namespace, "kubeflow.org", "v1", "pytorchjobs") or \
        await served(custom_api, namespace, "kubeflow.org", "v1", "tfjobs")
    v2 = await served(custom_api, namespace, GROUP, VERSION, "trainjobs")
    what = f"{kind} ({wanted[0]}/{wanted[1]}) is not served by this cluster"
    if wanted[0] == GROUP and v1:
        return (f"{what}, which runs the Kubeflow training operator (Trainer v1: TFJob, PyTorchJob): set "
                "`operator: pytorch-operator` or `tf-operator`, or install Kubeflow Trainer v2 (" + INSTALL + ")")
    if wanted[0] != GROUP and v2:
        return (f"{what}, which runs Kubeflow Trainer v2 (TrainJob, {GROUP}/{VERSION}): set `operator: trainer` "
                f"(and `trainingRuntime`, default {DEFAULT_RUNTIME}), or install the training operator v1.8")
    if not v1 and not v2:
        return (f"{what}: neither Kubeflow Trainer v2 (TrainJob) nor the training operator (Trainer v1: TFJob, "
                f"PyTorchJob) is installed; install Kubeflow Trainer v2 ({INSTALL}) and set `operator: trainer`, "
                "or the training operator v1.8 for tf-operator / pytorch-operator")
    return f"{what}: is the Kubeflow training operator installed, and does it serve {wanted[1]}?"
