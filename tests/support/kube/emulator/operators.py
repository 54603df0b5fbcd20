"""kubeflow/training-operator v1.8.1 controllers (TFJob, PyTorchJob) for the emulator.

A port of the reconcile loop of ``pkg/controller.v1/common`` (ReconcileJobs, ReconcilePods,
ReconcileServices, CleanUpResources), ``pkg/util/status.go`` (conditions) and the framework parts
of ``pkg/controller.v1/tensorflow`` and ``pkg/controller.v1/pytorch`` (defaults, TF_CONFIG, the
PyTorch env vars, UpdateJobStatus), with the names, labels and messages of the real operator.

Not emulated: gang scheduling/PodGroups, elastic PyTorch (HPA, PET_RDZV_*), the PyTorch workers'
``init-pytorch`` init container (an ``nslookup`` loop on the master's service name, which has no DNS
here), the validating webhooks (those are in webhooks.py, called by the store), the controller's work-queue retry counting (``backoffLimit``
counts container restarts and new failures as if the queue never retried), Evaluator/AllWorkers
subtleties beyond the code below.
"""
from __future__ import annotations

import asyncio
import copy
import datetime
import json
import logging
from typing import Any

from .api import PODS, SERVICES, ApiError, Resource
from .crds import PYTORCHJOBS, TFJOBS

log = logging.getLogger(__name__)

JOB_NAME_LABEL = "training.kubeflow.org/job-name"
OPERATOR_NAME_LABEL = "training.kubeflow.org/operator-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"

EXIT_CODE_MAGIC = 0xBEEF


def now_str() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s: str) -> float:
    return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def gen_general_name(job_name: str, rt: str, index: Any) -> str:
    return f"{job_name}-{rt.lower()}-{index}".replace("/", "-")


# ----------------------------------------------------------------------------- conditions (pkg/util/status.go)

def _cond(status: dict, ctype: str) -> dict | None:
    for c in status.get("conditions") or []:
        if c["type"] == ctype:
            return c
    return None


def is_true(status: dict, ctype: str) -> bool:
    c = _cond(status, ctype)
    return bool(c and c["status"] == "True")


def is_failed(status: dict) -> bool:
    return is_true(status, "Failed")


def is_succeeded(status: dict) -> bool:
    return is_true(status, "Succeeded")


def is_finished(status: dict) -> bool:
    return is_failed(status) or is_succeeded(status)


def update_job_conditions(status: dict, ctype: str, cstatus: str, reason: str, message: str) -> None:
    t = now_str()
    condition = {"type": ctype, "status": cstatus, "lastUpdateTime": t, "lastTransitionTime": t,
                 "reason": reason, "message": message}
    if is_failed(status):
        return
    cur = _cond(status, ctype)
    if cur is not None and cur["status"] == cstatus and cur.get("reason") == reason:
        return
    if cur is not None and cur["status"] == cstatus:
        condition["lastTransitionTime"] = cur.get("lastTransitionTime", t)
    new = []
    for c in status.get("conditions") or []:
        if ctype == "Restarting" and c["type"] == "Running":
            continue
        if ctype == "Running" and c["type"] == "Restarting":
            continue
        if c["type"] == ctype:
            continue
        if ctype in ("Failed", "Succeeded") and c["type"] == "Running":
            c = dict(c, status="False")
        new.append(c)
    status["conditions"] = new + [condition]


# ----------------------------------------------------------------------------- pods helpers

def container_exit_code(pod: dict, container: str) -> int:
    code = EXIT_CODE_MAGIC
    for st in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (st.get("state") or {}).get("terminated")
        if st.get("name") == container and term is not None:
            code = int(term.get("exitCode", 0))
    return code


def pod_phase(pod: dict) -> str:
    return (pod.get("status") or {}).get("phase", "Pending")


def is_active(pod: dict) -> bool:
    return pod_phase(pod) not in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp")


def owned_by(obj: dict, owner: dict) -> bool:
    uid = owner["metadata"].get("uid")
    return any(r.get("controller") and r.get("uid") == uid
               for r in obj["metadata"].get("ownerReferences") or [])


# ----------------------------------------------------------------------------- the common job controller

class JobController:
    res: Resource
    kind: str
    controller_name: str
    replica_specs_key: str
    default_container: str
    default_port_name: str
    default_port: int
    default_restart_policy: str
    replica_types: list[str]            # canonical names, in the order the status update visits them

    def __init__(self, cluster):
        self.cluster = cluster
        self.queue: asyncio.Queue = asyncio.Queue()
        self.queued: set = set()
        self.timers: list[asyncio.TimerHandle] = []
        self._exit_events: set = set()

    # -- plumbing
    def enqueue(self, ns: str, name: str) -> None:
        key = (ns, name)
        if key not in self.queued:
            self.queued.add(key)
            self.queue.put_nowait(key)

    def enqueue_after(self, ns: str, name: str, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        self.timers.append(loop.call_later(max(0.0, seconds), self.enqueue, ns, name))

    def on_event(self, etype: str, res: Resource, obj: dict) -> None:
        md = obj.get("metadata") or {}
        if res == self.res:
            if etype != "DELETED":
                self.enqueue(md.get("namespace", "default"), md["name"])
        elif res in (PODS, SERVICES):
            for ref in md.get("ownerReferences") or []:
                if ref.get("controller") and ref.get("kind") == self.kind \
                        and ref.get("apiVersion") == self.res.api_version:
                    self.enqueue(md.get("namespace", "default"), ref["name"])

    async def run(self) -> None:
        self.cluster.subscribe(self.on_event)
        for job in self.cluster.list(self.res):
            self.enqueue(job["metadata"].get("namespace", "default"), job["metadata"]["name"])
        try:
            while True:
                key = await self.queue.get()
                self.queued.discard(key)
                try:
                    self.reconcile(*key)
                except ApiError as e:
                    log.warning("%s %s/%s: reconcile error %s", self.kind, *key, e.message)
                    self.enqueue_after(*key, 0.2)
                except Exception:  # keep the controller alive, as controller-runtime does
                    log.exception("%s %s/%s: reconcile failed", self.kind, *key)
                    self.enqueue_after(*key, 0.5)
        finally:
            for t in self.timers:
                t.cancel()

    def event(self, job: dict, type_: str, reason: str, message: str) -> None:
        try:
            self.cluster.record_event(job, reason, message, type_)
        except Exception:  # events are best effort, as in client-go's recorder
            log.debug("event not recorded", exc_info=True)

    # -- defaults (SetDefaults_TFJob / SetDefaults_PyTorchJob)
    def set_defaults(self, job: dict) -> None:
        spec = job.setdefault("spec", {})
        run_policy = spec.setdefault("runPolicy", {})
        run_policy.setdefault("cleanPodPolicy", "None")
        specs = spec.setdefault(self.replica_specs_key, {}) or {}
        spec[self.replica_specs_key] = specs
        for typ in self.replica_types:          # setTypeNameToCamelCase
            for t in list(specs):
                if t.lower() == typ.lower() and t != typ:
                    specs[typ] = specs.pop(t)
                    break
        for rspec in specs.values():
            if rspec.get("replicas") is None:
                rspec["replicas"] = 1
            if not rspec.get("restartPolicy"):
                rspec["restartPolicy"] = self.default_restart_policy
            pod_spec = rspec.setdefault("template", {}).setdefault("spec", {})
            containers = pod_spec.get("containers") or []
            if containers:
                idx = next((i for i, c in enumerate(containers) if c.get("name") == self.default_container), 0)
                ports = containers[idx].setdefault("ports", [])
                if not any(p.get("name") == self.default_port_name for p in ports):
                    ports.append({"name": self.default_port_name, "containerPort": self.default_port})

    # -- labels/refs
    def gen_labels(self, job_name: str) -> dict:
        return {OPERATOR_NAME_LABEL: self.controller_name, JOB_NAME_LABEL: job_name.replace("/", "-")}

    def owner_ref(self, job: dict) -> dict:
        return {"apiVersion": self.res.api_version, "kind": self.kind, "name": job["metadata"]["name"],
                "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}

    # -- hooks
    def is_master_role(self, replicas: dict, rtype: str, index: int) -> bool:
        raise NotImplementedError

    def set_cluster_spec(self, job: dict, template: dict, rt: str, index: str) -> None:
        raise NotImplementedError

    def update_job_status(self, job: dict, replicas: dict, status: dict, pods: list[dict]) -> None:
        raise NotImplementedError

    # -- reconcile (ReconcileJobs)
    def reconcile(self, ns: str, name: str) -> None:
        stored = self.cluster.get(self.res, ns, name)
        if stored is None or stored["metadata"].get("deletionTimestamp"):
            return
        job = copy.deepcopy(stored)
        self.set_defaults(job)
        replicas = job["spec"][self.replica_specs_key]
        run_policy = job["spec"]["runPolicy"]
        status = copy.deepcopy(stored.get("status") or {})
        if _cond(status, "Created") is None:        # onOwnerCreateFunc
            update_job_conditions(status, "Created", "True", self.kind + "Created",
                                  f"{self.kind} {name} is created.")
        old = copy.deepcopy(stored.get("status") or {})

        all_pods = [p for p in self.cluster.list(PODS, ns, f"{JOB_NAME_LABEL}={name.replace('/', '-')}")
                    if owned_by(p, job)]
        services = [s for s in self.cluster.list(SERVICES, ns, f"{JOB_NAME_LABEL}={name.replace('/', '-')}")
                    if owned_by(s, job)]

        if is_finished(status):
            self.delete_pods_and_services(job, run_policy, status, all_pods)
            self.cleanup_job(job, run_policy, status)
            if is_succeeded(status):
                for rs in (status.get("replicaStatuses") or {}).values():
                    if rs.get("active"):
                        rs["succeeded"] = rs.get("succeeded", 0) + rs.pop("active")
            self.write_status(job, old, status)
            return

        if run_policy.get("suspend"):
            self.delete_pods_and_services(job, run_policy, status, all_pods)
            for rs in (status.get("replicaStatuses") or {}).values():
                rs.pop("active", None)
            msg = f"{self.kind} {name} is suspended."
            if is_true(status, "Running"):
                update_job_conditions(status, "Running", "False", self.kind + "Suspended", msg)
            if not is_true(status, "Suspended"):
                update_job_conditions(status, "Suspended", "True", self.kind + "Suspended", msg)
                self.event(job, "Normal", self.kind + "Suspended", msg)
            self.write_status(job, old, status)
            return
        if is_true(status, "Suspended"):
            msg = f"{self.kind} {name} is resumed."
            update_job_conditions(status, "Suspended", "False", self.kind + "Resumed", msg)
            status["startTime"] = now_str()
            self.event(job, "Normal", self.kind + "Resumed", msg)

        active = sum(1 for p in all_pods if is_active(p))
        failed = sum(1 for p in all_pods if pod_phase(p) == "Failed")
        total = sum(int(s["replicas"]) for s in replicas.values())
        prev_failed = sum(rs.get("failed", 0) for rs in (status.get("replicaStatuses") or {}).values())
        failure_message = None
        if run_policy.get("backoffLimit") is not None:
            limit = int(run_policy["backoffLimit"])
            exceeds = failed > prev_failed and active != total and 1 > limit
            if exceeds or self.past_backoff_limit(limit, replicas, all_pods):
                failure_message = f"Job {name} has failed because it has reached the specified backoff limit"
        if failure_message is None and run_policy.get("activeDeadlineSeconds") is not None \
                and status.get("startTime"):
            if datetime.datetime.now(datetime.timezone.utc).timestamp() - parse_time(status["startTime"]) \
                    >= int(run_policy["activeDeadlineSeconds"]):
                failure_message = f"Job {name} has failed because it was active longer than specified deadline"
        if failure_message is not None:
            status.setdefault("completionTime", now_str())
            self.delete_pods_and_services(job, run_policy, status, all_pods)
            self.cleanup_job(job, run_policy, status)
            self.event(job, "Normal", self.kind + "Failed", failure_message)
            update_job_conditions(status, "Failed", "True", self.kind + "Failed", failure_message)
            self.write_status(job, old, status, force=True)
            return

        for rtype, spec in replicas.items():
            self.reconcile_pods(job, status, all_pods, rtype, spec, replicas)
            self.reconcile_services(job, services, rtype, spec)
        self.update_job_status(job, replicas, status, all_pods)
        if is_finished(status):
            # the real operator cleans up on the next sync triggered by its own status update
            self.enqueue(ns, name)
        self.write_status(job, old, status)

    def write_status(self, job: dict, old: dict, status: dict, force: bool = False) -> None:
        if force or status != old:
            md = job["metadata"]
            self.cluster.update_status(self.res, md.get("namespace", "default"), md["name"], status)

    def past_backoff_limit(self, limit: int, replicas: dict, pods: list[dict]) -> bool:
        result = 0
        for rtype, spec in replicas.items():
            if spec.get("restartPolicy") not in ("OnFailure", "Always", "ExitCode"):
                continue
            for p in pods:
                if p["metadata"].get("labels", {}).get(REPLICA_TYPE_LABEL) != rtype.lower() \
                        or pod_phase(p) != "Running":
                    continue
                st = p.get("status") or {}
                for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
                    result += int(cs.get("restartCount", 0))
        return result > 0 if limit == 0 else result >= limit

    def delete_pods_and_services(self, job: dict, run_policy: dict, status: dict, pods: list[dict]) -> None:
        if not pods:
            return
        policy = run_policy.get("cleanPodPolicy") or "None"
        if is_finished(status) and policy == "None":
            return
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp"):
                continue
            if is_finished(status) and policy == "Running" and pod_phase(pod) not in ("Running", "Pending"):
                continue
            md = pod["metadata"]
            self._delete(PODS, md["namespace"], md["name"])
            self.event(job, "Normal", "SuccessfulDeletePod", f"Deleted pod: {md['name']}")
            if self._delete(SERVICES, md["namespace"], md["name"]):
                self.event(job, "Normal", "SuccessfulDeleteService", f"Deleted service: {md['name']}")

    def _delete(self, res: Resource, ns: str, name: str) -> bool:
        try:
            self.cluster.delete(res, ns, name)
            return True
        except ApiError as e:
            if e.code == 404:
                return False
            raise

    def cleanup_job(self, job: dict, run_policy: dict, status: dict) -> None:
        ttl = run_policy.get("ttlSecondsAfterFinished")
        if ttl is None or run_policy.get("suspend"):
            return
        if not status.get("completionTime"):
            return
        md = job["metadata"]
        remaining = parse_time(status["completionTime"]) + int(ttl) \
            - datetime.datetime.now(datetime.timezone.utc).timestamp()
        if remaining <= 0:
            self._delete(self.res, md.get("namespace", "default"), md["name"])
        else:
            self.enqueue_after(md.get("namespace", "default"), md["name"], remaining + 0.05)

    # -- ReconcilePods
    def reconcile_pods(self, job: dict, status: dict, pods: list[dict], rtype: str, spec: dict,
                       replicas: dict) -> None:
        rt = rtype.lower()
        name = job["metadata"]["name"]
        pods = [p for p in pods if p["metadata"].get("labels", {}).get(REPLICA_TYPE_LABEL) == rt]
        num = int(spec["replicas"])
        status.setdefault("replicaStatuses", {})[rtype] = {}
        slices: dict[int, list[dict]] = {i: [] for i in range(num)}
        for p in pods:
            try:
                idx = int(p["metadata"]["labels"][REPLICA_INDEX_LABEL])
            except (KeyError, ValueError):
                continue
            slices.setdefault(idx, []).append(p)
        for index in sorted(slices):
            podslice = slices[index]
            if len(podslice) > 1:
                log.warning("We have too many pods for %s %d", rt, index)
            elif not podslice:
                if 0 <= index < num:
                    self.create_new_pod(job, rtype, index, spec, self.is_master_role(replicas, rtype, index))
            else:
                pod = podslice[0]
                pmd = pod["metadata"]
                if index < 0 or index >= num:
                    self._delete(PODS, pmd["namespace"], pmd["name"])
                exit_code = container_exit_code(pod, self.default_container)
                if exit_code != EXIT_CODE_MAGIC:
                    self.event_once(job, pod, exit_code)
                if pod_phase(pod) == "Failed":
                    policy = spec.get("restartPolicy")
                    if (policy == "ExitCode" and exit_code >= 128) or policy in ("OnFailure", "Always"):
                        if not pmd.get("deletionTimestamp"):
                            self._delete(PODS, pmd["namespace"], pmd["name"])
                        msg = f"job {name} is restarting because {rtype} replica(s) failed."
                        self.event(job, "Warning", self.kind + "Restarting", msg)
                        update_job_conditions(status, "Restarting", "True", self.kind + "Restarting", msg)
                    elif policy == "ExitCode":
                        msg = f'job "{name}" is failing because "{rtype}" replica(s) failed.'
                        self.event(job, "Warning", self.kind + "Failed", msg)
                        update_job_conditions(status, "Failed", "True", self.kind + "Failed", msg)
                rs = status["replicaStatuses"][rtype]
                key = {"Running": "active", "Succeeded": "succeeded", "Failed": "failed"}.get(pod_phase(pod))
                if key:
                    rs[key] = rs.get(key, 0) + 1

    def event_once(self, job: dict, pod: dict, code: int) -> None:
        key = (pod["metadata"].get("uid"), code)
        if key in self._exit_events:
            return
        self._exit_events.add(key)
        md = pod["metadata"]
        self.event(job, "Normal", "ExitedWithCode", f"Pod: {md['namespace']}.{md['name']} exited with code {code}")

    def create_new_pod(self, job: dict, rtype: str, index: int, spec: dict, master: bool) -> None:
        rt = rtype.lower()
        md = job["metadata"]
        labels = self.gen_labels(md["name"])
        labels[REPLICA_TYPE_LABEL] = rt
        labels[REPLICA_INDEX_LABEL] = str(index)
        if master:
            labels[JOB_ROLE_LABEL] = "master"
        template = copy.deepcopy(spec.get("template") or {})
        tmd = template.setdefault("metadata", {})
        tmd["name"] = gen_general_name(md["name"], rt, str(index))
        tmd.setdefault("labels", {})
        tmd["labels"] = {**(tmd["labels"] or {}), **labels}
        self.set_cluster_spec(job, template, rt, str(index))
        pod_spec = template.setdefault("spec", {})
        if pod_spec.get("restartPolicy"):
            self.event(job, "Warning", "SettedPodTemplateRestartPolicy",
                       "Restart policy in pod template will be overwritten by restart policy in replica spec")
        policy = spec.get("restartPolicy")
        pod_spec["restartPolicy"] = "Never" if policy == "ExitCode" else policy
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": tmd["name"], "namespace": md.get("namespace", "default"),
                            "labels": tmd["labels"], "ownerReferences": [self.owner_ref(job)]},
               "spec": pod_spec}
        if tmd.get("annotations"):
            pod["metadata"]["annotations"] = tmd["annotations"]
        try:
            created = self.cluster.create(PODS, pod)
        except ApiError as e:
            if e.code == 409:
                return
            self.event(job, "Warning", "FailedCreatePod", f"Error creating: {e.message}")
            raise
        self.event(job, "Normal", "SuccessfulCreatePod", f"Created pod: {created['metadata']['name']}")

    # -- ReconcileServices
    def reconcile_services(self, job: dict, services: list[dict], rtype: str, spec: dict) -> None:
        rt = rtype.lower()
        num = int(spec["replicas"])
        have = {s["metadata"].get("labels", {}).get(REPLICA_INDEX_LABEL) for s in services
                if s["metadata"].get("labels", {}).get(REPLICA_TYPE_LABEL) == rt}
        for index in range(num):
            if str(index) not in have:
                self.create_new_service(job, rtype, spec, str(index))

    def create_new_service(self, job: dict, rtype: str, spec: dict, index: str) -> None:
        rt = rtype.lower()
        md = job["metadata"]
        labels = self.gen_labels(md["name"])
        labels[REPLICA_TYPE_LABEL] = rt
        labels[REPLICA_INDEX_LABEL] = index
        ports = []
        for c in (spec.get("template") or {}).get("spec", {}).get("containers") or []:
            if c.get("name") == self.default_container:
                ports = [{"name": p.get("name", ""), "port": p["containerPort"]} for p in c.get("ports") or []]
                break
        svc = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": gen_general_name(md["name"], rt, index),
                            "namespace": md.get("namespace", "default"), "labels": dict(labels),
                            "ownerReferences": [self.owner_ref(job)]},
               "spec": {"clusterIP": "None", "selector": dict(labels), "ports": ports}}
        try:
            self.cluster.create(SERVICES, svc)
        except ApiError as e:
            if e.code == 409:
                return
            self.event(job, "Warning", "FailedCreateService", f"Error creating: {e.message}")
            raise
        self.event(job, "Normal", "SuccessfulCreateService", f"Created service: {svc['metadata']['name']}")


def _mark_complete(status: dict) -> None:
    status.setdefault("completionTime", now_str())


# ----------------------------------------------------------------------------- TFJob

class TFJobController(JobController):
    res = TFJOBS
    kind = "TFJob"
    controller_name = "tfjob-controller"
    replica_specs_key = "tfReplicaSpecs"
    default_container = "tensorflow"
    default_port_name = "tfjob-port"
    default_port = 2222
    default_restart_policy = "Never"
    replica_types = ["Chief", "Evaluator", "Master", "PS", "Worker"]

    def set_defaults(self, job: dict) -> None:
        super().set_defaults(job)
        if job["spec"].get("successPolicy") is None:
            job["spec"]["successPolicy"] = ""

    @staticmethod
    def contains_chief_or_master(replicas: dict) -> bool:
        return "Chief" in replicas or "Master" in replicas

    def is_master_role(self, replicas, rtype, index):
        if self.contains_chief_or_master(replicas):
            return rtype in ("Chief", "Master")
        return rtype == "Worker" and index == 0

    def port_for(self, job: dict, rtype: str) -> int:
        for c in job["spec"]["tfReplicaSpecs"][rtype].get("template", {}).get("spec", {}).get("containers") or []:
            if c.get("name") == self.default_container:
                for p in c.get("ports") or []:
                    if p.get("name") == self.default_port_name:
                        return int(p["containerPort"])
        return self.default_port

    def is_distributed(self, job: dict) -> bool:
        count = 0
        for typ in self.replica_types:
            s = job["spec"]["tfReplicaSpecs"].get(typ)
            if s is not None:
                count += 1 if s.get("replicas") is None else int(s["replicas"])
        return count != 1

    def gen_tf_config(self, job: dict, rt: str, index: str) -> str:
        ns = job["metadata"].get("namespace", "default")
        cluster: dict[str, list[str]] = {}
        for rtype, spec in job["spec"]["tfReplicaSpecs"].items():
            port = self.port_for(job, rtype)
            cluster[rtype.lower()] = [f"{gen_general_name(job['metadata']['name'], rtype.lower(), str(i))}.{ns}.svc:{port}"
                                      for i in range(int(spec["replicas"]))]
        i = int(index)
        if job["spec"].get("enableDynamicWorker"):
            sparse = {"worker": {}, "ps": []}
            if rt == "ps":
                sparse["ps"].append(cluster[rt][i])
            elif rt == "worker":
                sparse["ps"] = cluster.get("ps")
                sparse["worker"][str(i)] = cluster[rt][i]
            cfg = {"cluster": sparse, "task": {"type": rt, "index": i}}
        else:
            cfg = {"cluster": dict(sorted(cluster.items())), "task": {"type": rt, "index": i},
                   "environment": "cloud"}
        return json.dumps(cfg, separators=(",", ":"))   # Go's json.Marshal: compact, map keys sorted

    def set_cluster_spec(self, job, template, rt, index):
        if not self.is_distributed(job):
            return
        cfg = self.gen_tf_config(job, rt, index)
        for c in template.get("spec", {}).get("containers") or []:
            if c.get("name") == self.default_container:
                c.setdefault("env", [])
                c["env"] = (c["env"] or []) + [{"name": "TF_CONFIG", "value": cfg}]
                break

    def worker0_completed(self, job: dict, replicas: dict, pods: list[dict]) -> bool:
        if "Worker" not in replicas:
            return True
        for p in pods:
            lb = p["metadata"].get("labels", {})
            if lb.get(REPLICA_TYPE_LABEL) == "worker" and lb.get(REPLICA_INDEX_LABEL) == "0":
                if container_exit_code(p, self.default_container) == 0 and pod_phase(p) == "Succeeded":
                    return True
        return False

    def update_job_status(self, job, replicas, status, pods):
        md = job["metadata"]
        ns, name = md.get("namespace", "default"), md["name"]
        worker0 = self.worker0_completed(job, replicas, pods)
        if not status.get("startTime"):
            status["startTime"] = now_str()
            ads = job["spec"]["runPolicy"].get("activeDeadlineSeconds")
            if ads is not None:
                self.enqueue_after(ns, name, int(ads) + 0.05)
        restarting = _cond(status, "Restarting")
        for rtype in self.replica_types:
            if rtype not in replicas:
                continue
            spec = replicas[rtype]
            rs = status["replicaStatuses"].setdefault(rtype, {})
            succeeded, running, failed = rs.get("succeeded", 0), rs.get("active", 0), rs.get("failed", 0)
            expected = int(spec["replicas"]) - succeeded
            if self.contains_chief_or_master(replicas):
                if rtype in ("Chief", "Master"):
                    if running > 0:
                        update_job_conditions(status, "Running", "True", "TFJobRunning",
                                              f"TFJob {ns}/{name} is running.")
                    if expected == 0:
                        msg = f"TFJob {ns}/{name} successfully completed."
                        self.event(job, "Normal", "TFJobSucceeded", msg)
                        _mark_complete(status)
                        update_job_conditions(status, "Succeeded", "True", "TFJobSucceeded", msg)
            elif rtype == "Worker":
                if expected == 0 or (worker0 and job["spec"].get("successPolicy") != "AllWorkers"):
                    msg = f"TFJob {ns}/{name} successfully completed."
                    self.event(job, "Normal", "TFJobSucceeded", msg)
                    _mark_complete(status)
                    update_job_conditions(status, "Succeeded", "True", "TFJobSucceeded", msg)
                elif running > 0:
                    update_job_conditions(status, "Running", "True", "TFJobRunning",
                                          f"TFJob {ns}/{name} is running.")
            if failed > 0:
                if restarting is not None:
                    update_job_conditions(status, "Restarting", "True", restarting["reason"], restarting["message"])
                else:
                    if job["spec"].get("enableDynamicWorker") and rtype == "Worker":
                        continue
                    msg = f"TFJob {ns}/{name} has failed because {failed} {rtype} replica(s) failed."
                    self.event(job, "Normal", "TFJobFailed", msg)
                    _mark_complete(status)
                    update_job_conditions(status, "Failed", "True", "TFJobFailed", msg)


# ----------------------------------------------------------------------------- PyTorchJob

class PyTorchJobController(JobController):
    res = PYTORCHJOBS
    kind = "PyTorchJob"
    controller_name = "pytorchjob-controller"
    replica_specs_key = "pytorchReplicaSpecs"
    default_container = "pytorch"
    default_port_name = "pytorchjob-port"
    default_port = 23456
    default_restart_policy = "OnFailure"
    replica_types = ["Master", "Worker"]

    def set_defaults(self, job):
        super().set_defaults(job)
        spec = job["spec"]
        ep = spec.get("elasticPolicy")
        if ep is not None:
            if ep.get("maxReplicas") is not None and ep.get("minReplicas") is None:
                ep["minReplicas"] = ep["maxReplicas"]
            elif ep.get("minReplicas") is not None and ep.get("maxReplicas") is None:
                ep["maxReplicas"] = ep["minReplicas"]
            elif ep.get("minReplicas") is None and ep.get("maxReplicas") is None:
                w = spec["pytorchReplicaSpecs"].get("Worker", {}).get("replicas")
                ep["minReplicas"] = ep["maxReplicas"] = w
        if (ep is not None and ep.get("nProcPerNode") is None) or ep is None:
            if spec.get("nprocPerNode") is None:
                spec["nprocPerNode"] = "auto"

    def is_master_role(self, replicas, rtype, index):
        if "Master" in replicas:
            return rtype == "Master"
        return rtype == "Worker" and index == 0

    def set_cluster_spec(self, job, template, rt, index):
        spec = job["spec"]
        replicas = spec["pytorchReplicaSpecs"]
        total = sum(int(s["replicas"]) for s in replicas.values())
        try:
            nproc = int(spec.get("nprocPerNode"))
        except (TypeError, ValueError):
            nproc = 1
        world = total * nproc
        master_env: list[dict] = []
        if "Master" in replicas:
            port = None
            for c in replicas["Master"].get("template", {}).get("spec", {}).get("containers") or []:
                if c.get("name") == self.default_container:
                    for p in c.get("ports") or []:
                        if p.get("name") == self.default_port_name:
                            port = int(p["containerPort"])
            if port is None:
                raise ValueError("port not found")
            addr = gen_general_name(job["metadata"]["name"], "master", "0")
            master_env = [{"name": "MASTER_PORT", "value": str(port)},
                          {"name": "PET_MASTER_PORT", "value": str(port)},
                          {"name": "MASTER_ADDR", "value": addr},
                          {"name": "PET_MASTER_ADDR", "value": addr}]
        for c in template.get("spec", {}).get("containers") or []:
            env = list(c.get("env") or [])
            env.append({"name": "PYTHONUNBUFFERED", "value": "1"})
            if "Master" in replicas:
                env += copy.deepcopy(master_env)
                rank = int(index) + (1 if rt == "worker" else 0)
                env += [{"name": "WORLD_SIZE", "value": str(world)},
                        {"name": "RANK", "value": str(rank)},
                        {"name": "PET_NODE_RANK", "value": str(rank)}]
            if spec.get("nprocPerNode") is not None:
                env.append({"name": "PET_NPROC_PER_NODE", "value": str(spec["nprocPerNode"])})
            if spec.get("elasticPolicy") is None:
                env.append({"name": "PET_NNODES", "value": str(total)})
            c["env"] = env

    def update_job_status(self, job, replicas, status, pods):
        md = job["metadata"]
        ns, name = md.get("namespace", "default"), md["name"]
        if not status.get("startTime"):
            status["startTime"] = now_str()
            ads = job["spec"]["runPolicy"].get("activeDeadlineSeconds")
            if ads is not None:
                self.enqueue_after(ns, name, int(ads) + 0.05)
        for rtype in self.replica_types:
            if rtype not in replicas:
                continue
            spec = replicas[rtype]
            rs = status["replicaStatuses"].setdefault(rtype, {})
            sel = {**self.gen_labels(name), REPLICA_TYPE_LABEL: rtype.lower()}
            rs["selector"] = ",".join(f"{k}={v}" for k, v in sorted(sel.items()))
            succeeded, running, failed = rs.get("succeeded", 0), rs.get("active", 0), rs.get("failed", 0)
            n = int(spec["replicas"])
            expected = n - succeeded
            if "Master" in replicas:
                if rtype == "Master":
                    if running > 0:
                        update_job_conditions(status, "Running", "True", "PyTorchJobRunning",
                                              f"PyTorchJob {name} is running.")
                    if expected == 0:
                        msg = f"PyTorchJob {name} is successfully completed."
                        self.event(job, "Normal", "PyTorchJobSucceeded", msg)
                        _mark_complete(status)
                        update_job_conditions(status, "Succeeded", "True", "PyTorchJobSucceeded", msg)
                        return
            elif rtype == "Worker":
                if expected == 0 or (job["spec"].get("elasticPolicy") is not None and succeeded > 0):
                    msg = f"PyTorchJob {ns}/{name} successfully completed."
                    self.event(job, "Normal", "PyTorchJobSucceeded", msg)
                    _mark_complete(status)
                    update_job_conditions(status, "Succeeded", "True", "PyTorchJobSucceeded", msg)
                elif running > 0:
                    update_job_conditions(status, "Running", "True", "PyTorchJobRunning",
                                          f"PyTorchJob {ns}/{name} is running.")
            if failed > 0 and n > succeeded + running:
                if spec.get("restartPolicy") != "Never":
                    msg = f"PyTorchJob {name} is restarting because {failed} {rtype} replica(s) failed."
                    self.event(job, "Warning", "PyTorchJobRestarting", msg)
                    update_job_conditions(status, "Restarting", "True", "PyTorchJobRestarting", msg)
                else:
                    msg = f"PyTorchJob {name} is failed because {failed} {rtype} replica(s) failed."
                    self.event(job, "Normal", "PyTorchJobFailed", msg)
                    _mark_complete(status)
                    update_job_conditions(status, "Failed", "True", "PyTorchJobFailed", msg)


async def start_tfjob_controller(cluster) -> None:
    await TFJobController(cluster).run()


async def start_pytorchjob_controller(cluster) -> None:
    await PyTorchJobController(cluster).run()
