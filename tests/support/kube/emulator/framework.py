"""microsoft/frameworkcontroller v1.0.1's Framework controller for the emulator.

A port of ``pkg/controller/controller.go`` (syncFrameworkState, syncFrameworkAttemptCompletionPolicy,
syncTaskState, completeTaskAttempt, completeFrameworkAttempt) and of the parts of
``pkg/apis/frameworkcontroller/v1`` it uses (NewConfigMap, NewPod with its labels, annotations,
placeholders and env vars, the completion codes of completion.go, RetryPolicySpec.ShouldRetry,
state transitions with their times).

Per FrameworkAttempt the controller creates the ConfigMap ``<framework>-attempt`` (owned by the
Framework, finalizer ``foregroundDeletion``) and the task pods ``<framework>-<taskrole>-<index>``
(owned by the ConfigMap).  The store has no foreground-deletion garbage collector, so this module
plays that part for those ConfigMaps: it deletes the ConfigMap's pods and removes the finalizer once
they are gone (what the GC does for ``propagationPolicy=Foreground``).

Not emulated: the local-cache creation timeouts (the store is synchronous), framework/task retry
delays for transient *conflict* failures (retried at once), FrameworkCompletedRetainSec (completed
frameworks are kept), framework scale up/down (``DeletionPending`` of tasks), status compression,
the podGracefulDeletionTimeoutSec force deletion (pods are deleted with their own grace period).
"""
from __future__ import annotations

import asyncio
import copy
import datetime
import json
import logging
import uuid

from .api import CONFIGMAPS, PODS, ApiError, Resource
from .crds import FRAMEWORKS

log = logging.getLogger(__name__)

FC = "FC_"
ANN_FRAMEWORK_NAMESPACE = "FC_FRAMEWORK_NAMESPACE"
ANN_FRAMEWORK_NAME = "FC_FRAMEWORK_NAME"
ANN_TASKROLE_NAME = "FC_TASKROLE_NAME"
ANN_TASK_INDEX = "FC_TASK_INDEX"
ANN_CONFIGMAP_NAME = "FC_CONFIGMAP_NAME"
ANN_POD_NAME = "FC_POD_NAME"
ANN_FRAMEWORK_UID = "FC_FRAMEWORK_UID"
ANN_FRAMEWORK_ATTEMPT_ID = "FC_FRAMEWORK_ATTEMPT_ID"
ANN_FRAMEWORK_ATTEMPT_INSTANCE_UID = "FC_FRAMEWORK_ATTEMPT_INSTANCE_UID"
ANN_CONFIGMAP_UID = "FC_CONFIGMAP_UID"
ANN_TASKROLE_UID = "FC_TASKROLE_UID"
ANN_TASK_UID = "FC_TASK_UID"
ANN_TASK_ATTEMPT_ID = "FC_TASK_ATTEMPT_ID"
ENV_TASK_ATTEMPT_INSTANCE_UID = "FC_TASK_ATTEMPT_INSTANCE_UID"
ENV_POD_UID = "FC_POD_UID"
FOREGROUND_FINALIZER = "foregroundDeletion"

# completion.go
SUCCEEDED, FAILED = "Succeeded", "Failed"
PERMANENT, TRANSIENT, CONFLICT = "Permanent", "Transient", "Conflict"
COMPLETION_CODES = {
    200: ("ContainerTransientFailed", FAILED, [TRANSIENT]),
    201: ("ContainerTransientConflictFailed", FAILED, [TRANSIENT, CONFLICT]),
    210: ("ContainerPermanentFailed", FAILED, [PERMANENT]),
    0: ("Succeeded", SUCCEEDED, []),
    -100: ("ConfigMapExternalDeleted", FAILED, [TRANSIENT]),
    -101: ("PodExternalDeleted", FAILED, [TRANSIENT]),
    -110: ("ConfigMapLocalCacheCreationTimeout", FAILED, [TRANSIENT]),
    -111: ("PodLocalCacheCreationTimeout", FAILED, [TRANSIENT]),
    -120: ("PodCreationTransientError", FAILED, [TRANSIENT]),
    -200: ("PodCreationPermanentError", FAILED, [PERMANENT]),
    -210: ("StopFrameworkRequested", FAILED, [PERMANENT]),
    -220: ("FrameworkAttemptCompletion", FAILED, [PERMANENT]),
    -230: ("DeleteTaskRequested", FAILED, [PERMANENT]),
    -300: ("PodFailedWithoutFailedContainer", FAILED, []),
    -310: ("PodCreationUnknownError", FAILED, []),
}
CODE_STOP_FRAMEWORK_REQUESTED = -210
CODE_FRAMEWORK_ATTEMPT_COMPLETION = -220
CODE_DELETE_TASK_REQUESTED = -230


def now_str() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def completion_status(code: int, diag: str, phrase: str | None = None, ctype: tuple | None = None) -> dict:
    p, name, attrs = COMPLETION_CODES.get(code, ("ContainerUnrecognizedFailed", FAILED, []))
    return {"code": code, "phrase": phrase or p,
            "type": {"name": ctype[0] if ctype else name, "attributes": list(ctype[1] if ctype else attrs)},
            "diagnostics": diag}


def get_task_name(framework: str, role: str, index: int) -> str:
    return f"{framework}-{role}-{index}"


def config_map_name(framework: str) -> str:
    return f"{framework}-attempt"


# ----------------------------------------------------------------------------- status constructors (funcs.go)

def new_task_attempt_status(fname: str, role: str, index: int, attempt_id: int) -> dict:
    return {"id": attempt_id, "startTime": now_str(), "runTime": None, "completionTime": None,
            "instanceUID": None, "podName": get_task_name(fname, role, index), "podUID": None,
            "podNodeName": None, "podIP": None, "podHostIP": None, "completionStatus": None}


def new_task_status(fname: str, role: str, index: int) -> dict:
    t = now_str()
    return {"index": index, "instanceUID": str(uuid.uuid4()), "startTime": t, "runTime": None,
            "completionTime": None, "state": "TaskAttemptCreationPending", "transitionTime": t,
            "deletionPending": False,
            "retryPolicyStatus": {"totalRetriedCount": 0, "accountableRetriedCount": 0, "retryDelaySec": None},
            "attemptStatus": new_task_attempt_status(fname, role, index, 0)}


def new_attempt_status(f: dict, attempt_id: int) -> dict:
    fname = f["metadata"]["name"]
    roles = []
    for tr in f["spec"].get("taskRoles") or []:
        roles.append({"name": tr["name"], "podGracefulDeletionTimeoutSec":
                      (tr.get("task") or {}).get("podGracefulDeletionTimeoutSec"),
                      "taskStatuses": [new_task_status(fname, tr["name"], i)
                                       for i in range(int(tr.get("taskNumber", 0)))]})
    return {"id": attempt_id, "startTime": now_str(), "runTime": None, "completionTime": None,
            "instanceUID": None, "configMapName": config_map_name(fname), "configMapUID": None,
            "completionStatus": None, "taskRoleStatuses": roles}


def new_framework_status(f: dict) -> dict:
    t = now_str()
    return {"startTime": t, "runTime": None, "completionTime": None, "state": "AttemptCreationPending",
            "transitionTime": t,
            "retryPolicyStatus": {"totalRetriedCount": 0, "accountableRetriedCount": 0, "retryDelaySec": None},
            "attemptStatus": new_attempt_status(f, 0)}


def transition_framework(status: dict, dst: str) -> None:
    if status["state"] == dst:
        return
    t = now_str()
    if dst == "AttemptRunning":
        status["attemptStatus"]["runTime"] = t
        status["runTime"] = status.get("runTime") or t
    if dst == "AttemptCompleted":
        status["attemptStatus"]["completionTime"] = t
    if dst == "Completed":
        status["completionTime"] = t
    status["state"] = dst
    status["transitionTime"] = t


def transition_task(ts: dict, dst: str) -> None:
    if ts["state"] == dst:
        return
    t = now_str()
    if dst == "TaskAttemptRunning":
        ts["attemptStatus"]["runTime"] = t
        ts["runTime"] = ts.get("runTime") or t
    if dst == "TaskAttemptCompleted":
        ts["attemptStatus"]["completionTime"] = t
    if dst == "TaskCompleted":
        ts["completionTime"] = t
    ts["state"] = dst
    ts["transitionTime"] = t


def should_retry(rp: dict, rps: dict, cs: dict) -> tuple[bool, bool]:
    """RetryPolicySpec.ShouldRetry -> (shouldRetry, isAccountable)."""
    ct = cs["type"]
    if cs["code"] in (CODE_STOP_FRAMEWORK_REQUESTED, CODE_FRAMEWORK_ATTEMPT_COMPLETION, CODE_DELETE_TASK_REQUESTED):
        return False, True
    failed = ct["name"] == FAILED
    if rp.get("fancyRetryPolicy") and failed:
        if TRANSIENT in ct["attributes"]:
            return True, False
        if PERMANENT in ct["attributes"]:
            return False, True
    mrc = int(rp.get("maxRetryCount", 0) or 0)
    if mrc == -2 or (failed and mrc == -1) or (failed and rps["accountableRetriedCount"] < mrc):
        return True, True
    return False, True


def task_completion_type(ts: dict) -> str | None:
    cs = ts["attemptStatus"].get("completionStatus")
    return cs["type"]["name"] if cs else None


def is_task_completed(ts: dict) -> bool:
    return not ts.get("deletionPending") and ts["state"] == "TaskCompleted"


def extract_pod_completion_status(pod: dict) -> dict:
    st = pod.get("status") or {}
    out: dict = {}
    if st.get("reason"):
        out["reason"] = st["reason"]
    if st.get("message"):
        out["message"] = st["message"]
    containers = []
    for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
        term = (cs.get("state") or {}).get("terminated")
        if term is None:
            continue
        c = {"name": cs.get("name"), "code": term.get("exitCode", 0)}
        for k in ("reason", "message", "signal"):
            if term.get(k):
                c[k] = term[k]
        containers.append(c)
    if containers:
        out["containers"] = containers
    return out


def match_completion_code(pod: dict) -> dict:
    """MatchCompletionCodeInfos: container codes 200/201/210, else the last failed container's code."""
    st = pod.get("status") or {}
    statuses = (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or [])
    for code in (200, 201, 210):
        for cs in statuses:
            term = (cs.get("state") or {}).get("terminated")
            if term is not None and int(term.get("exitCode", 0)) == code:
                matched = {"containers": [{"name": cs.get("name"), "code": code}]}
                return completion_status(code, "Pod failed: PodPattern matched: "
                                         + json.dumps(matched, separators=(",", ":")))
    last = None
    for cs in statuses:
        term = (cs.get("state") or {}).get("terminated")
        if term is not None and int(term.get("exitCode", 0)) != 0:
            if last is None or (term.get("finishedAt") or "") > (last.get("finishedAt") or ""):
                last = term
    diag = "Pod failed: PodPattern unmatched: " + json.dumps(extract_pod_completion_status(pod),
                                                             separators=(",", ":"))
    if last is None:
        return completion_status(-300, diag)
    return completion_status(int(last["exitCode"]), diag, "ContainerUnrecognizedFailed", (FAILED, []))


# ----------------------------------------------------------------------------- the controller

class FrameworkController:
    def __init__(self, cluster):
        self.cluster = cluster
        self.queue: asyncio.Queue = asyncio.Queue()
        self.queued: set = set()
        self._seq = 0
        self._order: dict[str, int] = {}

    def enqueue(self, key: tuple) -> None:
        if key not in self.queued:
            self.queued.add(key)
            self.queue.put_nowait(key)

    def on_event(self, etype: str, res: Resource, obj: dict) -> None:
        md = obj.get("metadata") or {}
        ns = md.get("namespace", "default")
        if res == FRAMEWORKS:
            if etype != "DELETED":
                self.enqueue(("f", ns, md["name"]))
        elif res in (PODS, CONFIGMAPS):
            fname = (md.get("labels") or {}).get(ANN_FRAMEWORK_NAME)
            if fname:
                self.enqueue(("f", ns, fname))
                self.enqueue(("gc", ns, config_map_name(fname)))

    async def run(self) -> None:
        self.cluster.subscribe(self.on_event)
        for f in self.cluster.list(FRAMEWORKS):
            self.enqueue(("f", f["metadata"]["namespace"], f["metadata"]["name"]))
        loop = asyncio.get_running_loop()
        while True:
            key = await self.queue.get()
            self.queued.discard(key)
            try:
                if key[0] == "gc":
                    self.foreground_gc(key[1], key[2])
                else:
                    self.sync_framework(key[1], key[2])
            except ApiError as e:
                log.warning("Framework %s: sync error %s", key, e.message)
                loop.call_later(0.2, self.enqueue, key)
            except Exception:
                log.exception("Framework %s: sync failed", key)
                loop.call_later(0.5, self.enqueue, key)

    # -- the garbage collector's foreground deletion, for the attempt ConfigMaps
    def foreground_gc(self, ns: str, cm_name: str) -> None:
        cm = self.cluster.get(CONFIGMAPS, ns, cm_name)
        if cm is None or not cm["metadata"].get("deletionTimestamp") \
                or FOREGROUND_FINALIZER not in (cm["metadata"].get("finalizers") or []):
            return
        uid = cm["metadata"]["uid"]
        remaining = 0
        for pod in self.cluster.list(PODS, ns):
            if any(r.get("uid") == uid for r in pod["metadata"].get("ownerReferences") or []):
                remaining += 1
                if not pod["metadata"].get("deletionTimestamp"):
                    self._delete(PODS, ns, pod["metadata"]["name"])
        if remaining == 0:
            fins = [x for x in cm["metadata"].get("finalizers") or [] if x != FOREGROUND_FINALIZER]
            self.cluster.patch_metadata(CONFIGMAPS, ns, cm_name, finalizers=fins)

    def _delete(self, res: Resource, ns: str, name: str, **kw) -> bool:
        try:
            self.cluster.delete(res, ns, name, **kw)
            return True
        except ApiError as e:
            if e.code == 404:
                return False
            raise

    # -- syncFramework
    def sync_framework(self, ns: str, name: str) -> None:
        f = self.cluster.get(FRAMEWORKS, ns, name)
        if f is None:
            return
        old = copy.deepcopy(f.get("status"))
        if not f.get("status"):
            f["status"] = new_framework_status(f)
        for _ in range(8):   # the real controller re-enqueues itself after each persisted step
            before = copy.deepcopy(f["status"])
            self.sync_framework_state(f)
            if f["status"] == before:
                break
        if f["status"] != old:
            self.cluster.update_status(FRAMEWORKS, ns, name, f["status"])

    def get_cm(self, f: dict) -> dict | None:
        st = f["status"]["attemptStatus"]
        cm = self.cluster.get(CONFIGMAPS, f["metadata"]["namespace"], st["configMapName"])
        if cm is None:
            return None
        if st.get("configMapUID") and cm["metadata"]["uid"] != st["configMapUID"]:
            return None
        if not any(r.get("uid") == f["metadata"]["uid"] for r in cm["metadata"].get("ownerReferences") or []):
            return None
        return cm

    def sync_framework_state(self, f: dict) -> None:
        status = f["status"]
        spec = f["spec"]
        ns = f["metadata"]["namespace"]
        if status["state"] == "Completed":
            return
        cm = None
        if status["state"] != "AttemptCompleted":
            cm = self.get_cm(f)
            if cm is None:
                if status["state"] == "AttemptCreationRequested":
                    if spec.get("executionType") == "Stop":
                        diag, code = "User has requested to stop the Framework", CODE_STOP_FRAMEWORK_REQUESTED
                    else:
                        diag, code = ("ConfigMap does not appear in the local cache within timeout 5m0s, "
                                      "so consider it was deleted and explicitly delete it", -110)
                    self.complete_framework_attempt(f, True, {**completion_status(code, diag), "trigger": None})
                    return
                if status["state"] != "AttemptCreationPending":
                    if status["attemptStatus"]["completionStatus"] is None:
                        self.complete_framework_attempt(
                            f, True, {**completion_status(-100, "ConfigMap was deleted by others"), "trigger": None})
                    else:
                        self.complete_framework_attempt(f, True, None)
                    return
            else:
                if not cm["metadata"].get("deletionTimestamp"):
                    if status["state"] == "AttemptDeletionPending":
                        self._delete(CONFIGMAPS, ns, cm["metadata"]["name"])
                        transition_framework(status, "AttemptDeletionRequested")
                        self.enqueue(("gc", ns, cm["metadata"]["name"]))
                    if status["state"] != "AttemptDeletionRequested" \
                            and status["state"] == "AttemptCreationRequested":
                        transition_framework(status, "AttemptPreparing")
                else:
                    if status["attemptStatus"]["completionStatus"] is None:
                        status["attemptStatus"]["completionStatus"] = {
                            **completion_status(-100, "ConfigMap is being deleted by others"), "trigger": None}
                    transition_framework(status, "AttemptDeleting")
                    self.enqueue(("gc", ns, cm["metadata"]["name"]))

        if status["state"] == "AttemptCompleted":
            retry, accountable = should_retry(spec.get("retryPolicy") or {}, status["retryPolicyStatus"],
                                              status["attemptStatus"]["completionStatus"])
            if not retry:
                transition_framework(status, "Completed")
                return
            rps = status["retryPolicyStatus"]
            rps["totalRetriedCount"] += 1
            if accountable:
                rps["accountableRetriedCount"] += 1
            rps["retryDelaySec"] = None
            status["attemptStatus"] = new_attempt_status(f, rps["totalRetriedCount"])
            transition_framework(status, "AttemptCreationPending")
            return

        if status["state"] == "AttemptCreationPending":
            if f["metadata"].get("deletionTimestamp"):
                return
            if spec.get("executionType") == "Create":
                return
            if spec.get("executionType") == "Stop":
                self.complete_framework_attempt(f, True, {
                    **completion_status(CODE_STOP_FRAMEWORK_REQUESTED, "User has requested to stop the Framework"),
                    "trigger": None})
                return
            cm = self.create_config_map(f)
            st = status["attemptStatus"]
            st["configMapUID"] = cm["metadata"]["uid"]
            st["instanceUID"] = f"{st['id']}_{cm['metadata']['uid']}"
            transition_framework(status, "AttemptCreationRequested")
            return

        if status["state"] in ("AttemptPreparing", "AttemptRunning", "AttemptDeletionRequested",
                               "AttemptDeleting"):
            if not self.is_completing(f) and spec.get("executionType") == "Stop":
                self.complete_framework_attempt(f, False, {
                    **completion_status(CODE_STOP_FRAMEWORK_REQUESTED, "User has requested to stop the Framework"),
                    "trigger": None})
            if not self.is_completing(f):
                self.sync_completion_policy(f)
            for trs in status["attemptStatus"]["taskRoleStatuses"]:
                for ts in trs["taskStatuses"]:
                    self.sync_task_state(f, cm, trs["name"], ts["index"])
            if status["state"] == "AttemptPreparing" and any(
                    ts["state"] == "TaskAttemptRunning" and not ts.get("deletionPending")
                    for trs in status["attemptStatus"]["taskRoleStatuses"] for ts in trs["taskStatuses"]):
                transition_framework(status, "AttemptRunning")

    @staticmethod
    def is_completing(f: dict) -> bool:
        return f["status"]["state"] in ("AttemptDeletionPending", "AttemptDeletionRequested", "AttemptDeleting")

    def create_config_map(self, f: dict) -> dict:
        md = f["metadata"]
        st = f["status"]["attemptStatus"]
        cm = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": st["configMapName"], "namespace": md["namespace"],
                           "ownerReferences": [{"apiVersion": FRAMEWORKS.api_version, "kind": "Framework",
                                                "name": md["name"], "uid": md["uid"], "controller": True,
                                                "blockOwnerDeletion": True}],
                           "finalizers": [FOREGROUND_FINALIZER],
                           "annotations": {ANN_FRAMEWORK_NAMESPACE: md["namespace"],
                                           ANN_FRAMEWORK_NAME: md["name"],
                                           ANN_CONFIGMAP_NAME: st["configMapName"],
                                           ANN_FRAMEWORK_UID: md["uid"],
                                           ANN_FRAMEWORK_ATTEMPT_ID: str(st["id"])},
                           "labels": {ANN_FRAMEWORK_NAME: md["name"]}}}
        try:
            return self.cluster.create(CONFIGMAPS, cm)
        except ApiError as e:
            if e.code == 409:
                existing = self.cluster.get(CONFIGMAPS, md["namespace"], st["configMapName"])
                if existing and any(r.get("uid") == md["uid"] for r in existing["metadata"].get("ownerReferences") or []):
                    return existing
            raise

    def complete_framework_attempt(self, f: dict, force: bool, cs: dict | None) -> None:
        status = f["status"]
        if status["attemptStatus"]["completionStatus"] is None:
            status["attemptStatus"]["completionStatus"] = cs
        for trs in status["attemptStatus"]["taskRoleStatuses"]:
            for ts in trs["taskStatuses"]:
                if ts["attemptStatus"]["completionStatus"] is None:
                    ts["attemptStatus"]["completionStatus"] = completion_status(
                        CODE_FRAMEWORK_ATTEMPT_COMPLETION, "Stop to complete current FrameworkAttempt")
        if force:
            for trs in status["attemptStatus"]["taskRoleStatuses"]:
                for ts in trs["taskStatuses"]:
                    if ts["state"] != "TaskCompleted":
                        if ts["state"] != "TaskAttemptCompleted":
                            transition_task(ts, "TaskAttemptCompleted")
                        ts["retryPolicyStatus"]["retryDelaySec"] = None
                        transition_task(ts, "TaskCompleted")
            transition_framework(status, "AttemptCompleted")
        else:
            transition_framework(status, "AttemptDeletionPending")

    def complete_task_attempt(self, f: dict, ts: dict, force: bool, cs: dict | None) -> None:
        if ts["attemptStatus"]["completionStatus"] is None:
            ts["attemptStatus"]["completionStatus"] = cs
        transition_task(ts, "TaskAttemptCompleted" if force else "TaskAttemptDeletionPending")

    def _ordered(self, trs: dict, pred, n: int) -> dict:
        done = sorted((ts for ts in trs["taskStatuses"] if pred(ts)),
                      key=lambda ts: (ts.get("completionTime") or "", self._order.get(ts["instanceUID"], 0)))
        return done[n]

    def _trigger(self, ts: dict, role: str, message: str) -> dict:
        cs = copy.deepcopy(ts["attemptStatus"]["completionStatus"])
        cs.pop("pod", None)
        return {**cs, "trigger": {"message": message, "taskRoleName": role, "taskIndex": ts["index"]}}

    def sync_completion_policy(self, f: dict) -> bool:
        status = f["status"]
        roles = {trs["name"]: trs for trs in status["attemptStatus"]["taskRoleStatuses"]}
        failed = lambda ts: is_task_completed(ts) and task_completion_type(ts) == FAILED  # noqa: E731
        succeeded = lambda ts: is_task_completed(ts) and task_completion_type(ts) == SUCCEEDED  # noqa: E731
        first = None
        for tr in f["spec"].get("taskRoles") or []:
            trs = roles.get(tr["name"])
            if trs is None:
                continue
            pol = tr.get("frameworkAttemptCompletionPolicy") or {}
            mf, ms = int(pol.get("minFailedTaskCount", -1)), int(pol.get("minSucceededTaskCount", -1))
            for minc, pred, word in ((mf, failed, "Failed"), (ms, succeeded, "Succeeded")):
                if minc >= 1:
                    cnt = sum(1 for ts in trs["taskStatuses"] if pred(ts))
                    if cnt >= minc:
                        trig = self._ordered(trs, pred, minc - 1)
                        key = (trig.get("completionTime") or "", self._order.get(trig["instanceUID"], 0))
                        if first is None or key < first[0]:
                            first = (key, self._trigger(trig, tr["name"],
                                                        f"{word}TaskCount {cnt} has reached Min{word}TaskCount "
                                                        f"{minc} in the TaskRole"))
        if first is not None:
            self.complete_framework_attempt(f, False, first[1])
            return True
        total = sum(int(tr.get("taskNumber", 0)) for tr in f["spec"].get("taskRoles") or [])
        if total >= 1:
            completed = sum(1 for trs in roles.values() for ts in trs["taskStatuses"] if is_task_completed(ts))
            if completed >= total:
                last = None
                for tr in f["spec"].get("taskRoles") or []:
                    trs = roles.get(tr["name"])
                    if trs is None or int(tr.get("taskNumber", 0)) == 0:
                        continue
                    ts = self._ordered(trs, is_task_completed, int(tr["taskNumber"]) - 1)
                    if last is None or (ts.get("completionTime") or "") > (last[0].get("completionTime") or ""):
                        last = (ts, tr["name"])
                self.complete_framework_attempt(f, False, self._all_completed(last, completed, total))
                return True
        return False

    @staticmethod
    def _all_completed(last: tuple | None, completed: int, total: int) -> dict:
        diag = (f"CompletedTaskCount {completed} has reached TotalTaskCount {total} and no user specified "
                "conditions in FrameworkAttemptCompletionPolicy have ever been triggered")
        trigger = None if last is None else {"message": diag, "taskRoleName": last[1], "taskIndex": last[0]["index"]}
        return {**completion_status(0, diag), "trigger": trigger}

    def sync_task_state(self, f: dict, cm: dict | None, role: str, index: int) -> None:
        ns = f["metadata"]["namespace"]
        trspec = next((tr for tr in f["spec"].get("taskRoles") or [] if tr["name"] == role), None)
        trs = next(trs for trs in f["status"]["attemptStatus"]["taskRoleStatuses"] if trs["name"] == role)
        ts = trs["taskStatuses"][index]
        ast = ts["attemptStatus"]
        if ts["state"] == "TaskCompleted":
            return
        if ts["state"] != "TaskAttemptCompleted":
            pod = self.cluster.get(PODS, ns, ast["podName"])
            if pod is not None and ast.get("podUID") and pod["metadata"]["uid"] != ast["podUID"]:
                pod = None
            if pod is None:
                if ts["state"] == "TaskAttemptCreationRequested":
                    self.complete_task_attempt(f, ts, True, completion_status(
                        -111, "Pod does not appear in the local cache within timeout 5m0s, "
                              "so consider it was deleted and explicitly delete it"))
                    return
                if ts["state"] != "TaskAttemptCreationPending":
                    if ast["completionStatus"] is None:
                        self.complete_task_attempt(f, ts, True, completion_status(-101, "Pod was deleted by others"))
                    else:
                        self.complete_task_attempt(f, ts, True, None)
                    self._stamp(ts)
                    return
            else:
                if not pod["metadata"].get("deletionTimestamp"):
                    if ts["state"] == "TaskAttemptDeletionPending":
                        self._delete(PODS, ns, ast["podName"])
                        transition_task(ts, "TaskAttemptDeletionRequested")
                    if ts["state"] == "TaskAttemptDeletionRequested":
                        return
                    if ts["state"] == "TaskAttemptCreationRequested":
                        transition_task(ts, "TaskAttemptPreparing")
                    pst = pod.get("status") or {}
                    ast["podNodeName"] = (pod.get("spec") or {}).get("nodeName", "")
                    ast["podIP"] = pst.get("podIP", "")
                    ast["podHostIP"] = pst.get("hostIP", "")
                    phase = pst.get("phase", "Pending")
                    if phase == "Pending":
                        transition_task(ts, "TaskAttemptPreparing")
                    elif phase == "Running":
                        transition_task(ts, "TaskAttemptRunning")
                    elif phase == "Succeeded":
                        cs = completion_status(0, "Pod succeeded")
                        cs["pod"] = extract_pod_completion_status(pod)
                        self.complete_task_attempt(f, ts, False, cs)
                        return
                    elif phase == "Failed":
                        cs = match_completion_code(pod)
                        cs["pod"] = extract_pod_completion_status(pod)
                        self.complete_task_attempt(f, ts, False, cs)
                        return
                else:
                    if ast["completionStatus"] is None:
                        ast["completionStatus"] = completion_status(-101, "Pod is being deleted by others")
                    transition_task(ts, "TaskAttemptDeleting")
                    return
        if ts["state"] in ("TaskAttemptPreparing", "TaskAttemptRunning"):
            return
        if ts["state"] == "TaskAttemptCompleted":
            if trspec is None:
                retry, accountable = False, True
            else:
                retry, accountable = should_retry((trspec.get("task") or {}).get("retryPolicy") or {},
                                                  ts["retryPolicyStatus"], ast["completionStatus"])
            if not retry:
                transition_task(ts, "TaskCompleted")
                self._stamp(ts)
            else:
                rps = ts["retryPolicyStatus"]
                rps["totalRetriedCount"] += 1
                if accountable:
                    rps["accountableRetriedCount"] += 1
                rps["retryDelaySec"] = None
                ts["attemptStatus"] = new_task_attempt_status(f["metadata"]["name"], role, index,
                                                              rps["totalRetriedCount"])
                transition_task(ts, "TaskAttemptCreationPending")
                return
        if ts["state"] == "TaskAttemptCreationPending":
            if self.is_completing(f) or cm is None:
                return
            pod = self.create_pod(f, cm, trspec, trs, ts)
            if pod is None:
                return
            ts["attemptStatus"]["podUID"] = pod["metadata"]["uid"]
            ts["attemptStatus"]["instanceUID"] = f"{ts['attemptStatus']['id']}_{pod['metadata']['uid']}"
            transition_task(ts, "TaskAttemptCreationRequested")
            return
        if ts["state"] == "TaskCompleted":
            if self.is_completing(f) or trspec is None:
                return
            self.sync_completion_policy(f)

    def _stamp(self, ts: dict) -> None:
        """Order of completion within one second (Go keeps the full time in memory)."""
        self._seq += 1
        self._order[ts["instanceUID"]] = self._seq

    def create_pod(self, f: dict, cm: dict, trspec: dict, trs: dict, ts: dict) -> dict | None:
        md = f["metadata"]
        ns, fname = md["namespace"], md["name"]
        role, index = trspec["name"], ts["index"]
        st = f["status"]["attemptStatus"]
        pod_name = ts["attemptStatus"]["podName"]
        template_json = json.dumps((trspec.get("task") or {}).get("pod") or {})
        for ph, val in (("FC_FRAMEWORK_NAMESPACE", ns), ("FC_FRAMEWORK_NAME", fname), ("FC_TASKROLE_NAME", role),
                        ("FC_TASK_INDEX", str(index)), ("FC_CONFIGMAP_NAME", st["configMapName"]),
                        ("FC_POD_NAME", pod_name)):
            template_json = template_json.replace("{{" + ph + "}}", val)
        template = json.loads(template_json)
        pmd = copy.deepcopy(template.get("metadata") or {})
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": pmd, "spec": template.get("spec") or {}}
        pmd["name"] = pod_name
        pmd["namespace"] = ns
        pmd["ownerReferences"] = (pmd.get("ownerReferences") or []) + [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": cm["metadata"]["name"], "uid": cm["metadata"]["uid"],
             "controller": True, "blockOwnerDeletion": True}]
        ann = {ANN_FRAMEWORK_NAMESPACE: ns, ANN_FRAMEWORK_NAME: fname, ANN_TASKROLE_NAME: role,
               ANN_TASK_INDEX: str(index), ANN_CONFIGMAP_NAME: st["configMapName"], ANN_POD_NAME: pod_name,
               ANN_FRAMEWORK_UID: md["uid"], ANN_FRAMEWORK_ATTEMPT_ID: str(st["id"]),
               ANN_FRAMEWORK_ATTEMPT_INSTANCE_UID: st["instanceUID"], ANN_CONFIGMAP_UID: st["configMapUID"],
               ANN_TASKROLE_UID: trs.setdefault("instanceUID", str(uuid.uuid4())),
               ANN_TASK_UID: ts["instanceUID"], ANN_TASK_ATTEMPT_ID: str(ts["attemptStatus"]["id"])}
        pmd["annotations"] = {**(pmd.get("annotations") or {}), **ann}
        pmd["labels"] = {**(pmd.get("labels") or {}), ANN_FRAMEWORK_NAME: fname, ANN_TASKROLE_NAME: role,
                         ANN_TASK_INDEX: str(index)}
        envs = [{"name": k, "value": ann[k]} for k in (
            ANN_FRAMEWORK_NAMESPACE, ANN_FRAMEWORK_NAME, ANN_TASKROLE_NAME, ANN_TASK_INDEX, ANN_CONFIGMAP_NAME,
            ANN_POD_NAME, ANN_FRAMEWORK_UID, ANN_FRAMEWORK_ATTEMPT_ID, ANN_FRAMEWORK_ATTEMPT_INSTANCE_UID,
            ANN_CONFIGMAP_UID, ANN_TASKROLE_UID, ANN_TASK_UID, ANN_TASK_ATTEMPT_ID)]
        envs.append({"name": ENV_POD_UID, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}})
        envs.append({"name": ENV_TASK_ATTEMPT_INSTANCE_UID,
                     "value": f"{ts['attemptStatus']['id']}_$({ENV_POD_UID})"})
        for key in ("containers", "initContainers"):
            for c in pod["spec"].get(key) or []:
                c["env"] = copy.deepcopy(envs) + (c.get("env") or [])
                c.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
        try:
            return self.cluster.create(PODS, pod)
        except ApiError as e:
            if e.code == 409:
                existing = self.cluster.get(PODS, ns, pod_name)
                if existing and any(r.get("uid") == cm["metadata"]["uid"]
                                    for r in existing["metadata"].get("ownerReferences") or []):
                    return existing
            if e.code in (400, 403, 422):
                code = -200 if e.code == 422 else -310
                self.complete_task_attempt(f, ts, True, completion_status(
                    code, "Failed to create Pod: " + json.dumps(e.status(), separators=(",", ":"))))
                return None
            raise


async def start_framework_controller(cluster) -> None:
    await FrameworkController(cluster).run()
