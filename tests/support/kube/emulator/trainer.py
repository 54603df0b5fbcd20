"""Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1, release v2.3.0) for the emulator: the
TrainJob and ClusterTrainingRuntime kinds, the TrainJob validating webhook and the TrainJob
controller with its JobSet / Job layer folded in.

From kubeflow/trainer v2.3.0 (commit 658725bd): the CRDs (`trainer_crds/`, descriptions removed),
`pkg/webhooks/trainjob_webhook.go` + `pkg/runtime/core/clustertrainingruntime.go` (ValidateObjects:
the runtime must exist), `pkg/controller/trainjob_controller.go`, the jobset plugin's builder and
status (`pkg/runtime/framework/plugins/jobset`: `spec.trainer` overrides the runtime's `node`
container of the job labelled `trainer.kubeflow.org/trainjob-ancestor-step: trainer`, conditions
`Complete` / `Failed` copied from the JobSet's), the torch plugin's `PET_*` environment, and
`runtimePatches` (the pod template's labels/annotations, volumes, containers' env/volumeMounts/
securityContext, imagePullSecrets, nodeSelector, tolerations, ...). What JobSet and the Job
controller would do is done here: pods `<trainjob>-<replicatedJob>-<jobIndex>-<completionIndex>-<5
random>` (an Indexed Job's), the labels `jobset.sigs.k8s.io/*`, `batch.kubernetes.io/job-completion-index`
(label, annotation and `JOB_COMPLETION_INDEX`), hostname/subdomain, JobSet's default
`restartPolicy: OnFailure` and the Job's default `backoffLimit: 6` (restarts and failed pods count).

Not emulated: TrainingRuntime (namespaced), initializer jobs' data/model steps beyond running their
pods, the CEL rules of the CRDs (x-kubernetes-validations), Kueue/managedBy, gang scheduling, the
Job and JobSet objects themselves (pods are owned by the TrainJob directly, so garbage collection
takes them with it), the runtime snapshot ConfigMap, MPI/JAX/XGBoost plugins' environments.
"""
from __future__ import annotations

import copy
import json
import logging
import secrets
from pathlib import Path
from typing import Any

from .api import PODS, ApiError, FieldError, Resource
from .crds import CustomResourceSchema
from .operators import JobController, is_active, now_str, owned_by, pod_phase

log = logging.getLogger(__name__)

TRAINER_GROUP = "trainer.kubeflow.org"
TRAINJOBS = Resource(TRAINER_GROUP, "v1alpha1", "trainjobs", "TrainJob")
CLUSTER_RUNTIMES = Resource(TRAINER_GROUP, "v1alpha1", "clustertrainingruntimes", "ClusterTrainingRuntime",
                            namespaced=False)
CRD_DIR = Path(__file__).with_name("trainer_crds")
CRD_FILES = {TRAINJOBS: "trainjobs.yaml", CLUSTER_RUNTIMES: "clustertrainingruntimes.yaml"}
WEBHOOK = "validator.trainjob.trainer.kubeflow.org"

ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOB_NAME = "batch.kubernetes.io/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
NODE = "node"  # constants.Node: the trainer's job and container
TRAINER_PORT = 29500  # constants.ContainerTrainerPort


def crd_schema(res: Resource) -> dict:
    """The openAPIV3Schema of the kind's one served version, from the fixture (JSON under a comment)."""
    text = (CRD_DIR / CRD_FILES[res]).read_text()
    crd = json.loads("\n".join(line for line in text.splitlines() if not line.startswith("#")))
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


class TrainJobValidator(CustomResourceSchema):
    """The CRD's schema (pruning, defaults, types, required), then the Trainer's validating webhook."""

    def __init__(self, cluster: Any) -> None:
        super().__init__(TRAINJOBS, crd_schema(TRAINJOBS))
        self.cluster = cluster

    def validate(self, obj: dict, field_validation: str = "Warn") -> list[FieldError]:
        errs = super().validate(obj, field_validation)
        if not errs:
            self.webhook(obj)
        return errs

    def webhook(self, obj: dict) -> None:
        """TrainJobValidator.ValidateCreate: the runtime kind must be known, the runtime must exist
        (403, the API server's wording of a denial from controller-runtime's `admission.Denied`)."""
        ref = (obj.get("spec") or {}).get("runtimeRef") or {}
        group_kind = f"{ref.get('kind', '')}.{ref.get('apiGroup', '')}" if ref.get("apiGroup") else ref.get("kind", "")
        if group_kind != f"ClusterTrainingRuntime.{TRAINER_GROUP}":
            message = f"unsupported runtime: {group_kind}"
        elif self.cluster.get(CLUSTER_RUNTIMES, None, ref.get("name", "")) is None:
            value = json.dumps({"name": ref.get("name", ""), "apiGroup": ref.get("apiGroup"), "kind": ref.get("kind")},
                               separators=(",", ":"))
            message = (f"spec.RuntimeRef: Invalid value: {value}: clustertrainingruntimes.trainer.kubeflow.org "
                       f"\"{ref.get('name', '')}\" not found: specified clusterTrainingRuntime must be created before "
                       "the TrainJob is created")
        else:
            return
        raise ApiError(403, "Forbidden", f'admission webhook "{WEBHOOK}" denied the request: {message}')


class RuntimeValidator(CustomResourceSchema):
    def __init__(self) -> None:
        super().__init__(CLUSTER_RUNTIMES, crd_schema(CLUSTER_RUNTIMES))


def install(cluster: Any) -> list[Resource]:
    cluster.register_custom_resource(TRAINJOBS, TrainJobValidator(cluster))
    cluster.register_custom_resource(CLUSTER_RUNTIMES, RuntimeValidator())
    cluster.register_controller(start_trainjob_controller)
    return [TRAINJOBS, CLUSTER_RUNTIMES]


# ----------------------------------------------------------------------------- conditions (metav1.Condition)

def set_condition(status: dict, ctype: str, cstatus: str, reason: str, message: str) -> None:
    """meta.SetStatusCondition: replace the type's condition, keep its transition time if unchanged."""
    conds = status.setdefault("conditions", [])
    for c in conds:
        if c["type"] == ctype:
            if c["status"] != cstatus:
                c["lastTransitionTime"] = now_str()
            c.update(status=cstatus, reason=reason, message=message)
            return
    conds.append({"type": ctype, "status": cstatus, "reason": reason, "message": message,
                  "lastTransitionTime": now_str()})


def condition_true(status: dict, ctype: str) -> bool:
    return any(c["type"] == ctype and c["status"] == "True" for c in status.get("conditions") or [])


def upsert_env(env: list[dict], *items: dict) -> list[dict]:
    out = list(env)
    for item in items:
        out = [e for e in out if e.get("name") != item["name"]] + [copy.deepcopy(item)]
    return out


def _cpus(resources: dict) -> int:
    """getNumCPUPerNode: the CPU limit (else request) as a whole number."""
    from .util import parse_quantity  # noqa: PLC0415 (the emulator's quantity parser)

    for kind in ("limits", "requests"):
        cpu = (resources.get(kind) or {}).get("cpu")
        if cpu is not None:
            return int(parse_quantity(str(cpu)))
    return 0


# ----------------------------------------------------------------------------- the controller

class TrainJobController(JobController):
    res = TRAINJOBS
    kind = "TrainJob"

    def reconcile(self, ns: str, name: str) -> None:
        stored = self.cluster.get(TRAINJOBS, ns, name)
        if stored is None or stored["metadata"].get("deletionTimestamp"):
            return
        job = copy.deepcopy(stored)
        spec = job.get("spec") or {}
        old = copy.deepcopy(stored.get("status") or {})
        status = copy.deepcopy(old)
        if condition_true(status, "Complete") or condition_true(status, "Failed"):
            return
        ref = spec.get("runtimeRef") or {}
        if (ref.get("kind"), ref.get("apiGroup")) != ("ClusterTrainingRuntime", TRAINER_GROUP):
            set_condition(status, "Failed", "True", "TrainingRuntimeNotSupported",
                          f"unsupported runtime: {ref.get('kind')}.{ref.get('apiGroup')}")
            self.write_status(job, old, status)
            return
        runtime = self.cluster.get(CLUSTER_RUNTIMES, None, ref.get("name", ""))
        if runtime is None:  # NewObjects: "not found ClusterTrainingRuntime specified in TrainJob"; requeued
            log.warning("TrainJob %s/%s: not found ClusterTrainingRuntime %s", ns, name, ref.get("name"))
            self.enqueue_after(ns, name, 1.0)
            return
        if spec.get("suspend"):
            set_condition(status, "Suspended", "True", "Suspended", "TrainJob is suspended")
            self.write_status(job, old, status)
            return
        if condition_true(status, "Suspended"):
            set_condition(status, "Suspended", "False", "Resumed", "TrainJob is resumed")
        pods = [p for p in self.cluster.list(PODS, ns, f"{JOBSET_NAME}={name}") if owned_by(p, job)]
        jobs_status, all_done, any_failed = [], True, False
        for rjob in ((runtime.get("spec") or {}).get("template") or {}).get("spec", {}).get("replicatedJobs") or []:
            counts = {"name": rjob["name"], "active": 0, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 0}
            for j in range(int(rjob.get("replicas", 1))):
                state = self.reconcile_job(job, runtime, rjob, j, pods)
                counts[state] = counts.get(state, 0) + 1
                all_done = all_done and state == "succeeded"
                any_failed = any_failed or state == "failed"
            jobs_status.append(counts)
        status["jobsStatus"] = jobs_status
        if any_failed:
            set_condition(status, "Failed", "True", "FailedJobs", "jobset failed due to one or more job failures")
            self.event(job, "Warning", "TrainJobFailed", f"TrainJob {name} failed")
        elif all_done and jobs_status:
            set_condition(status, "Complete", "True", "AllJobsCompleted", "jobset completed successfully")
        self.write_status(job, old, status)

    def reconcile_job(self, job: dict, runtime: dict, rjob: dict, j: int, pods: list[dict]) -> str:
        """One Job of a replicated job, as the Job controller runs an Indexed Job: a pod per
        completion index until it succeeds; failed pods and container restarts beyond backoffLimit
        fail the Job (and its active pods are deleted). Its state: active, succeeded or failed."""
        name = job["metadata"]["name"]
        job_name = f"{name}-{rjob['name']}-{j}"
        jspec = (rjob.get("template") or {}).get("spec") or {}
        completions = self.completions(job, runtime, rjob)
        mine = [p for p in pods if (p["metadata"].get("labels") or {}).get(JOB_NAME) == job_name]
        failures = sum(1 for p in mine if pod_phase(p) == "Failed") + sum(
            int(cs.get("restartCount", 0)) for p in mine for cs in (p.get("status") or {}).get("containerStatuses") or [])
        if failures > int(jspec.get("backoffLimit", 6)):
            for p in mine:
                if is_active(p):
                    self._delete(PODS, p["metadata"]["namespace"], p["metadata"]["name"])
            return "failed"
        done = 0
        for index in range(completions):
            at = [p for p in mine if (p["metadata"].get("labels") or {}).get(COMPLETION_INDEX) == str(index)]
            if any(pod_phase(p) == "Succeeded" for p in at):
                done += 1
            elif not any(is_active(p) for p in at):
                self.create_pod(job, runtime, rjob, j, index)
        return "succeeded" if done == completions else "active"

    @staticmethod
    def completions(job: dict, runtime: dict, rjob: dict) -> int:
        tmpl = rjob.get("template") or {}
        if ((tmpl.get("metadata") or {}).get("labels") or {}).get(ANCESTOR) == "trainer":
            trainer = (job.get("spec") or {}).get("trainer") or {}
            if trainer.get("numNodes") is not None:
                return int(trainer["numNodes"])
            return int((((runtime.get("spec") or {}).get("mlPolicy") or {}).get("numNodes")) or 1)
        jspec = tmpl.get("spec") or {}
        return int(jspec.get("completions") or jspec.get("parallelism") or 1)

    def pod_template(self, job: dict, runtime: dict, rjob: dict) -> dict:
        """The replicated job's pod template with the TrainJob's trainer overrides, the torch
        plugin's PET_* environment and the runtimePatches applied."""
        name = job["metadata"]["name"]
        spec = job.get("spec") or {}
        tmpl = rjob.get("template") or {}
        pod_tmpl = copy.deepcopy(((tmpl.get("spec") or {}).get("template")) or {})
        pod_spec = pod_tmpl.setdefault("spec", {})
        trainer = spec.get("trainer") or {}
        is_trainer = ((tmpl.get("metadata") or {}).get("labels") or {}).get(ANCESTOR) == "trainer"
        for c in pod_spec.get("containers") or []:
            if not is_trainer or c.get("name") != NODE:
                continue
            if trainer.get("image"):
                c["image"] = trainer["image"]
            if trainer.get("command"):
                c["command"] = list(trainer["command"])
            if trainer.get("args"):
                c["args"] = list(trainer["args"])
            if trainer.get("resourcesPerNode"):
                c["resources"] = copy.deepcopy(trainer["resourcesPerNode"])
            c["env"] = upsert_env(c.get("env") or [], *(trainer.get("env") or []))
            if ((runtime.get("spec") or {}).get("mlPolicy") or {}).get("torch") is not None:
                nproc = trainer.get("numProcPerNode")
                gpus = int(str(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0)))
                if nproc is None:
                    nproc = "auto" if gpus else max(1, _cpus(c.get("resources") or {}))
                c["env"] = upsert_env(
                    c["env"], {"name": "PET_NNODES", "value": str(self.completions(job, runtime, rjob))},
                    {"name": "PET_NPROC_PER_NODE", "value": str(nproc)},
                    {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
                        "fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}},
                    {"name": "PET_MASTER_ADDR", "value": f"{name}-{NODE}-0-0.{name}"},
                    {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)})
                ports = c.setdefault("ports", [])
                if not any(p.get("containerPort") == TRAINER_PORT for p in ports):
                    ports.append({"containerPort": TRAINER_PORT})
        for patch in spec.get("runtimePatches") or []:
            for rp in ((((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {})
                       .get("replicatedJobs") or []):
                if rp.get("name") == rjob["name"]:
                    apply_pod_patch(pod_tmpl, (((rp.get("template") or {}).get("spec") or {}).get("template")) or {})
        return pod_tmpl

    def create_pod(self, job: dict, runtime: dict, rjob: dict, j: int, index: int) -> None:
        md = job["metadata"]
        name, ns = md["name"], md.get("namespace", "default")
        job_name = f"{name}-{rjob['name']}-{j}"
        pod_tmpl = self.pod_template(job, runtime, rjob)
        pmd = pod_tmpl.get("metadata") or {}
        labels = {**(pmd.get("labels") or {}), JOBSET_NAME: name, REPLICATED_JOB: rjob["name"], JOB_INDEX: str(j),
                  JOB_NAME: job_name, "job-name": job_name, COMPLETION_INDEX: str(index)}
        annotations = {**(pmd.get("annotations") or {}), COMPLETION_INDEX: str(index)}
        pod_spec = pod_tmpl.get("spec") or {}
        pod_spec.setdefault("restartPolicy", "OnFailure")  # JobSet's defaulting webhook
        pod_spec["hostname"], pod_spec["subdomain"] = f"{job_name}-{index}", name
        for c in pod_spec.get("containers") or []:  # the Job controller's, on every container
            c["env"] = upsert_env(c.get("env") or [], {"name": "JOB_COMPLETION_INDEX", "valueFrom": {
                "fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}})
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{job_name}-{index}-{secrets.token_hex(3)[:5]}", "namespace": ns,
                            "labels": labels, "annotations": annotations,
                            "ownerReferences": [self.owner_ref(job)]},
               "spec": pod_spec}
        try:
            created = self.cluster.create(PODS, pod)
        except ApiError as e:
            self.event(job, "Warning", "FailedCreate", f"Error creating: {e.message}")
            raise
        self.event(job, "Normal", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}")


def apply_pod_patch(pod_tmpl: dict, patch: dict) -> None:
    """A PodTemplatePatch: labels/annotations merged; the PodSpecPatch's lists merged by name
    (volumes, containers' env and volumeMounts) or appended, its other fields set."""
    md, pmd = pod_tmpl.setdefault("metadata", {}), patch.get("metadata") or {}
    for key in ("labels", "annotations"):
        if pmd.get(key):
            md[key] = {**(md.get(key) or {}), **pmd[key]}
    spec, pspec = pod_tmpl.setdefault("spec", {}), patch.get("spec") or {}
    for key in ("serviceAccountName", "securityContext", "affinity", "terminationGracePeriodSeconds"):
        if key in pspec:
            spec[key] = copy.deepcopy(pspec[key])
    if pspec.get("nodeSelector"):
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **pspec["nodeSelector"]}
    for key in ("tolerations", "imagePullSecrets", "schedulingGates"):
        if pspec.get(key):
            spec[key] = (spec.get(key) or []) + copy.deepcopy(pspec[key])
    if pspec.get("volumes"):
        names = {v["name"] for v in pspec["volumes"]}
        spec["volumes"] = [v for v in spec.get("volumes") or [] if v.get("name") not in names] + copy.deepcopy(pspec["volumes"])
    for key in ("initContainers", "containers"):
        for cp in pspec.get(key) or []:
            for c in spec.get(key) or []:
                if c.get("name") != cp.get("name"):
                    continue
                c["env"] = upsert_env(c.get("env") or [], *(cp.get("env") or []))
                if cp.get("volumeMounts"):
                    paths = {m["mountPath"] for m in cp["volumeMounts"]}
                    c["volumeMounts"] = [m for m in c.get("volumeMounts") or [] if m.get("mountPath") not in paths] \
                        + copy.deepcopy(cp["volumeMounts"])
                if "securityContext" in cp:
                    c["securityContext"] = copy.deepcopy(cp["securityContext"])


async def start_trainjob_controller(cluster: Any) -> None:
    await TrainJobController(cluster).run()
