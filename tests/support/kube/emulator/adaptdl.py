"""AdaptDL's job controller (petuum/adaptdl v0.2.11, ``sched/adaptdl_sched/controller.py``) for the
emulator, and the PersistentVolumeClaims AdaptDL jobs mount.

The AdaptDLJob resource is validated with the published CRD's ``openAPIV3Schema`` (crds.py, from
shared/schemas). Per job the controller moves ``status.phase`` as ``_sync_job`` does: Pending ->
Starting (a new ``status.group``, one pod per replica) -> Running (every pod ready) -> Succeeded
(every pod of the group succeeded) or Failed (``reason: PodFailure``, ``message: "<pod> Failed"``);
a pod of a Running job that disappears (preemption, deletion) sends it to Stopping, then Pending
again for the next group. Pods are the job's ``spec.template`` made as ``_create_pod`` makes them:
name ``<job>-<uid>-<group>-<rank>``, labels ``adaptdl/job``, annotations ``adaptdl/group``,
``adaptdl/replicas``, ``adaptdl/rank``, ``restartPolicy: Never``, the ``adaptdl-shm`` volume and
the ADAPTDL_* environment, owned by the job.

Not emulated: Pollux's allocation (each job gets min(maxReplicas, 1) replica on the first node),
the supervisor (ADAPTDL_SUPERVISOR_URL points nowhere), the validating webhook.
"""
from __future__ import annotations

import asyncio
import copy
import logging

from .api import PODS, ApiError, Resource

log = logging.getLogger(__name__)

ADAPTDL_GROUP = "adaptdl.petuum.com"
ADAPTDLJOBS = Resource(ADAPTDL_GROUP, "v1", "adaptdljobs", "AdaptDLJob")
PVCS = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
SCHEMA_FILE = "adaptdl/adaptdljob-v1.schema.json"
SCHED_VERSION = "0.2.11"


def _phase(pod: dict) -> str:
    return (pod.get("status") or {}).get("phase", "Pending")


def _ready(pod: dict) -> bool:
    return _phase(pod) == "Running" or any(c.get("type") == "Ready" and c.get("status") == "True"
                                           for c in (pod.get("status") or {}).get("conditions") or [])


class AdaptDLController:
    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.queue: asyncio.Queue = asyncio.Queue()
        self.queued: set = set()

    def enqueue(self, key: tuple) -> None:
        if key not in self.queued:
            self.queued.add(key)
            self.queue.put_nowait(key)

    def on_event(self, etype: str, res: Resource, obj: dict) -> None:
        md = obj.get("metadata") or {}
        if res == ADAPTDLJOBS and etype != "DELETED":
            self.enqueue((md.get("namespace", "default"), md["name"]))
        elif res == PODS and (md.get("labels") or {}).get("adaptdl/job"):
            self.enqueue((md.get("namespace", "default"), md["labels"]["adaptdl/job"]))

    async def run(self) -> None:
        self.cluster.subscribe(self.on_event)
        for job in self.cluster.list(ADAPTDLJOBS):
            self.enqueue((job["metadata"]["namespace"], job["metadata"]["name"]))
        loop = asyncio.get_running_loop()
        while True:
            key = await self.queue.get()
            self.queued.discard(key)
            try:
                self.sync_job(*key)
            except ApiError as e:
                log.warning("AdaptDLJob %s: sync error %s", key, e.message)
                loop.call_later(0.2, self.enqueue, key)
            except Exception:
                log.exception("AdaptDLJob %s: sync failed", key)
                loop.call_later(0.5, self.enqueue, key)

    def sync_job(self, ns: str, name: str) -> None:
        job = self.cluster.get(ADAPTDLJOBS, ns, name)
        if job is None:
            return
        status = copy.deepcopy(job.get("status") or {})
        old = copy.deepcopy(status)
        phase = status.setdefault("phase", "Pending")
        pods = [p for p in self.cluster.list(PODS, ns, f"adaptdl/job={name}")
                if not p["metadata"].get("deletionTimestamp")]
        group = status.get("group", -1)
        current = [p for p in pods if p["metadata"].get("annotations", {}).get("adaptdl/group") == str(group)]
        replicas = max(1, min(int(job["spec"].get("maxReplicas") or 1), 1))
        if phase in ("Succeeded", "Failed"):
            pass
        elif current and all(_phase(p) == "Succeeded" for p in current) and len(current) == status.get("replicas"):
            status["phase"] = "Succeeded"
            status["completionTimestamp"] = _now()
        elif any(_phase(p) == "Failed" for p in current):
            bad = next(p for p in current if _phase(p) == "Failed")
            status.update(phase="Failed", reason="PodFailure", message=f"{bad['metadata']['name']} Failed",
                          completionTimestamp=_now())
        elif phase == "Pending":
            status["phase"] = "Starting"
            status["group"] = group + 1
            status["replicas"] = replicas
            for rank in range(replicas):
                self.create_pod(job, status["group"], rank, replicas)
        elif phase == "Starting":
            if len(current) != status.get("replicas"):
                status["phase"] = "Stopping"
            elif all(_ready(p) for p in current):
                status["phase"] = "Running"
        elif phase == "Running":
            if len(current) != status.get("replicas"):
                status["phase"] = "Stopping"  # a pod is gone (preempted, deleted): restart with a new group
        elif phase == "Stopping":
            for p in current:
                self._delete(ns, p["metadata"]["name"])
            if not current:
                status["phase"] = "Pending"
        status["readyReplicas"] = sum(1 for p in current if _ready(p))
        if status != old:
            self.cluster.update_status(ADAPTDLJOBS, ns, name, status)
            if status["phase"] in ("Pending", "Stopping"):
                asyncio.get_running_loop().call_later(0.05, self.enqueue, (ns, name))

    def _delete(self, ns: str, name: str) -> None:
        try:
            self.cluster.delete(PODS, ns, name)
        except ApiError as e:
            if e.code != 404:
                raise

    def create_pod(self, job: dict, group: int, rank: int, replicas: int) -> None:
        md = job["metadata"]
        pod = copy.deepcopy(job["spec"]["template"])
        pod["apiVersion"], pod["kind"] = "v1", "Pod"
        meta = pod.setdefault("metadata", {})
        meta["name"] = f"{md['name']}-{md['uid']}-{group}-{rank}"
        meta["namespace"] = md["namespace"]
        meta["ownerReferences"] = [{"apiVersion": "adaptdl.petuum.com/v1", "kind": "AdaptDLJob", "name": md["name"],
                                    "uid": md["uid"], "controller": True, "blockOwnerDeletion": True}]
        labels = meta.setdefault("labels", {})
        labels.update({"adaptdl": "true", "adaptdl/job": md["name"], "petuum.com/nodegroup": "all"})
        nodes = self.cluster.list(Resource("", "v1", "nodes", "Node", namespaced=False))
        node = nodes[0]["metadata"]["name"] if nodes else "node-1"
        meta.setdefault("annotations", {}).update({"adaptdl/replicas": str(replicas), "adaptdl/group": str(group),
                                                   "adaptdl/rank": str(rank), "adaptdl/node": node})
        spec = pod["spec"]
        spec["hostname"] = f"{md['name']}-{group}-{rank}"
        spec["restartPolicy"] = "Never"
        spec.setdefault("volumes", []).append({"name": "adaptdl-shm", "emptyDir": {"medium": "Memory"}})
        for c in spec["containers"]:
            c.setdefault("volumeMounts", []).append({"name": "adaptdl-shm", "mountPath": "/dev/shm"})
            env = c.setdefault("env", [])
            env += [{"name": "ADAPTDL_JOB_ID", "value": f"{md['namespace']}/{md['name']}"},
                    {"name": "ADAPTDL_MASTER_PORT", "value": str(47000 + group)},
                    {"name": "ADAPTDL_NUM_NODES", "value": "1"},
                    {"name": "ADAPTDL_NUM_RESTARTS", "value": str(group)},
                    {"name": "ADAPTDL_NUM_REPLICAS", "value": str(replicas)},
                    {"name": "ADAPTDL_REPLICA_RANK", "value": str(rank)},
                    {"name": "ADAPTDL_SUPERVISOR_URL", "value": "http://adaptdl-supervisor:8080"},
                    {"name": "ADAPTDL_SCHED_VERSION", "value": SCHED_VERSION}]
            if not (c.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu"):
                env.append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"})
        self.cluster.create(PODS, pod)


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def install_claims(cluster) -> None:
    """Serve core/v1 PersistentVolumeClaims (stored and validated like the other core kinds; the
    emulated kubelet mounts any volume as a pod-local directory)."""
    from . import validation

    validation._SCHEMA_FILES.setdefault(PVCS.kind, "persistentvolumeclaim-v1")  # kubernetes-validate's schema
    objects = getattr(cluster, "objects", None)
    if objects is not None:
        objects.setdefault(PVCS, {})


async def start_adaptdl_controller(cluster) -> None:
    await AdaptDLController(cluster).run()
