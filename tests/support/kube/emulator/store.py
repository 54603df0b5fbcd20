"""The API server's storage: objects, resourceVersions, watch history, GC, events."""
from __future__ import annotations

import asyncio
import copy
import secrets
import uuid
from collections import deque
from typing import Any, Awaitable, Callable

from . import admission, rbac, validation, webhooks
from .gc import FOREGROUND, GarbageCollector, validate_owner_references
from .api import (CONFIGMAPS, CORE_RESOURCES, EVENTS, NAMESPACES, NODES, PODS, RESOURCEQUOTAS, SECRETS, SERVICEACCOUNTS, SERVICES, ApiError, FieldError, Resource,
                  Validator, WatchCallback, already_exists, conflict, invalid, not_found)
from .policy import Policy
from .util import json_merge_patch, now_rfc3339, parse_label_selector

HISTORY = 2000


class Watcher:
    END = "END"  # queued by Store.end_watches: the stream ends (with the Status in the object: an ERROR first)

    def __init__(self, res: Resource, ns: str | None, match: Callable[[dict], bool]):
        self.res, self.ns, self.match = res, ns, match
        self.queue: asyncio.Queue = asyncio.Queue()

    def offer(self, type_: str, obj: dict, prev: dict | None) -> None:
        if self.ns and obj["metadata"].get("namespace") != self.ns:
            return
        now = self.match(obj)
        was = prev is not None and self.match(prev)
        if type_ == "MODIFIED":
            if now and not was:
                type_ = "ADDED"
            elif was and not now:
                type_ = "DELETED"
            elif not now:
                return
        elif not now:
            return
        self.queue.put_nowait((type_, obj))


class Store:
    """Implements api.Cluster."""

    def __init__(self, instance_id: str):
        self.instance_id = instance_id
        self.rv = 1
        self.objects: dict[Resource, dict[tuple[str, str], dict]] = {}
        self.history: deque = deque(maxlen=HISTORY)      # (rv, type, res, obj, prev)
        self.watchers: list[Watcher] = []
        self.subscribers: list[WatchCallback] = []
        self.custom: dict[Resource, Validator] = {}
        self.controllers: list[Callable[[Any], Awaitable[None]]] = []
        self.status_history: dict[tuple[str, str, str], list[dict]] = {}
        self.pod_deleter: Callable[[dict, float], None] | None = None   # set by the kubelet
        self.last_warnings: list[str] = []
        self.pods_stopped: set[str] = set()      # uids whose containers the kubelet has killed
        self.history = deque(maxlen=HISTORY)
        self.service_account_token: Callable[[str, str], str] | None = None  # set by the server (rbac.Tokens)
        self.policy = Policy()
        self.sidecar_image: str | None = None  # --sidecar-image: Istio's injector in labelled namespaces (sidecar.py)
        self.gc = GarbageCollector(self)
        self.compacted = 0  # resourceVersions up to here are compacted away (end_watches): older resumes get 410
        for r in CORE_RESOURCES + rbac.RESOURCES:
            self.objects[r] = {}

    # ------------------------------------------------------------ lookup
    def resource_for(self, group: str, version: str, plural: str) -> Resource | None:
        for r in self.objects:
            if r.group == group and r.version == version and r.plural == plural:
                return r
        return None

    def has_group_version(self, group: str, version: str | None = None) -> bool:
        return any(r.group == group and (version is None or r.version == version) for r in self.objects)

    # ------------------------------------------------------------ Cluster API
    def get(self, res: Resource, ns: str | None, name: str) -> dict | None:
        o = self.objects.get(res, {}).get((ns or "" if res.namespaced else "", name))
        return copy.deepcopy(o) if o is not None else None

    def list(self, res: Resource, ns: str | None = None, label_selector: str = "") -> list[dict]:
        match = parse_label_selector(label_selector)
        out = []
        for (ons, _), o in sorted(self.objects.get(res, {}).items()):
            if ns and res.namespaced and ons != ns:
                continue
            if match(o["metadata"].get("labels") or {}):
                out.append(copy.deepcopy(o))
        return out

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _emit(self, type_: str, res: Resource, obj: dict, prev: dict | None) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        snap = copy.deepcopy(obj)
        self.history.append((rv, type_, res, snap, prev))
        key = (res.plural, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if "status" in obj:
            hist = self.status_history.setdefault(key, [])
            if not hist or hist[-1] != obj["status"]:
                hist.append(copy.deepcopy(obj["status"]))
        for w in list(self.watchers):
            if w.res == res:
                w.offer(type_, snap, prev)
        if type_ != "DELETED":
            self.gc.changed(res, obj)
        for cb in list(self.subscribers):
            try:
                cb(type_, res, copy.deepcopy(snap))
            except Exception:           # a plug-in's bug must not break the store
                import traceback
                traceback.print_exc()

    def _check_ns(self, res: Resource, ns: str) -> None:
        if res.namespaced and ("", ns) not in self.objects[NAMESPACES]:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})

    def create(self, res: Resource, obj: dict, field_validation: str = "Ignore") -> dict:
        obj = copy.deepcopy(obj)
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the object provided is unrecognized (must be of type object)")
        md = obj.setdefault("metadata", {}) or {}
        obj["metadata"] = md
        obj["kind"] = res.kind
        obj["apiVersion"] = res.api_version
        ns = md.get("namespace") or "default" if res.namespaced else None
        if res.namespaced:
            md["namespace"] = ns
        else:
            md.pop("namespace", None)
        for k in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                  "deletionGracePeriodSeconds", "generation", "managedFields", "selfLink"):
            md.pop(k, None)
        if not md.get("name") and md.get("generateName"):
            md["name"] = md["generateName"] + secrets.token_hex(3)[:5]
        self._validate(res, obj, None, field_validation)
        if res.namespaced:
            self._check_ns(res, ns)
        key = (ns or "", md["name"])
        if key in self.objects[res]:
            raise already_exists(res, md["name"])
        self._default(res, obj)
        if res == PODS:
            from . import sidecar  # mutating admission first: the validating plug-ins see the sidecar
            sidecar.inject(self.get(NAMESPACES, None, ns), obj, self.sidecar_image)
            self._admit_pod(obj)
        elif res in (SECRETS, CONFIGMAPS, SERVICES):
            self._admit_count(res, ns, md["name"])
        md["uid"] = str(uuid.uuid4())
        md["creationTimestamp"] = now_rfc3339()
        md["generation"] = 1
        md["resourceVersion"] = self._next_rv()
        self.objects[res][key] = obj
        self._emit("ADDED", res, obj, None)
        return copy.deepcopy(obj)

    def _admit_pod(self, pod: dict) -> None:
        """Admission plug-ins a new pod meets: OpenShift's SCC, Pod Security and compute quotas
        (admission.py), ServiceAccount (the account must exist) and ResourceQuota (`pods` /
        `count/pods` of each quota in the namespace)."""
        md, spec = pod["metadata"], pod["spec"]
        ns, name, sa = md["namespace"], md["name"], spec.get("serviceAccountName") or "default"
        admission.admit(self, self.get(NAMESPACES, None, ns), pod, self.list(RESOURCEQUOTAS, ns))
        if sa != "default" and self.get(SERVICEACCOUNTS, ns, sa) is None:
            raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: error looking up service account '
                                             f'{ns}/{sa}: serviceaccount "{sa}" not found',
                           {"name": name, "kind": "pods"})
        for quota in self.list(RESOURCEQUOTAS, ns):
            hard = (quota.get("spec") or {}).get("hard") or {}
            for key in ("pods", "count/pods"):
                if key not in hard:
                    continue
                used = sum(1 for p in self.list(PODS, ns)
                           if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))
                if used + 1 > int(hard[key]):
                    raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: exceeded quota: '
                                   f'{quota["metadata"]["name"]}, requested: {key}=1, used: {key}={used}, '
                                   f'limited: {key}={hard[key]}', {"name": name, "kind": "pods"})

    def _admit_count(self, res: Resource, ns: str, name: str) -> None:
        """ResourceQuota on object counts (`count/secrets`, or the older `secrets`; configmaps,
        services alike): a create over a quota's hard limit is refused with the quota admission
        plug-in's words (`plugin/pkg/admission/resourcequota`, `apiserver/pkg/admission/plugin/resourcequota`)."""
        for quota in self.list(RESOURCEQUOTAS, ns):
            hard = (quota.get("spec") or {}).get("hard") or {}
            for key in (res.plural, f"count/{res.plural}"):
                if key not in hard:
                    continue
                used = len(self.list(res, ns))
                if used + 1 > int(hard[key]):
                    raise ApiError(403, "Forbidden", f'{res.plural} "{name}" is forbidden: exceeded quota: '
                                   f'{quota["metadata"]["name"]}, requested: {key}=1, used: {key}={used}, '
                                   f'limited: {key}={hard[key]}', {"name": name, "kind": res.plural})

    def _validate(self, res: Resource, obj: dict, old: dict | None, field_validation: str) -> None:
        self.last_warnings = []
        name = (obj.get("metadata") or {}).get("name") or ""
        if res in self.custom:
            validator = self.custom[res]
            errs: list[FieldError] = validator(obj, field_validation) or []
            self.last_warnings = list(getattr(validator, "warnings", None) or [])
        else:
            self.last_warnings = validation.decode(res, obj, field_validation)
            errs = validation.validate(res, obj)
            if old is not None and res == PODS:
                errs += validation.validate_pod_update(old, obj)
            if old is not None and res in (CONFIGMAPS, SECRETS):
                errs += validation.validate_immutable_update(old, obj)
        errs += validate_owner_references(obj.get("metadata") or {})
        if errs:
            raise invalid(res, name, errs)
        webhooks.check(res, obj, old)

    def _default(self, res: Resource, obj: dict) -> None:
        if res == PODS:
            spec = obj.setdefault("spec", {})
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("dnsPolicy", "ClusterFirst")
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
            spec.setdefault("serviceAccount", spec["serviceAccountName"])
            spec.setdefault("securityContext", {})
            spec.setdefault("enableServiceLinks", True)
            spec.setdefault("priority", 0)
            spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
            for kind in ("initContainers", "containers"):
                for c in spec.get(kind) or []:
                    c.setdefault("terminationMessagePath", "/dev/termination-log")
                    c.setdefault("terminationMessagePolicy", "File")
                    img = c.get("image", "")
                    tag = img.rsplit("/", 1)[-1]
                    c.setdefault("imagePullPolicy", "Always" if ":" not in tag or tag.endswith(":latest") else "IfNotPresent")
                    c.setdefault("resources", {})
                    r = c["resources"]
                    if r.get("limits") and not r.get("requests"):
                        r["requests"] = dict(r["limits"])
                    elif r.get("limits"):
                        for k, v in r["limits"].items():
                            r["requests"].setdefault(k, v)
            tolerations = spec.setdefault("tolerations", [])
            for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
                if not any(t.get("key") == key for t in tolerations):
                    tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                                        "tolerationSeconds": 300})
            obj["status"] = {"phase": "Pending", "qosClass": _qos(spec)}
        elif res.kind == "Secret" and not res.group:
            obj.setdefault("type", "Opaque")
            sd = obj.pop("stringData", None) or {}
            if sd:
                import base64
                data = obj.setdefault("data", {}) or {}
                obj["data"] = data
                for k, v in sd.items():
                    data[k] = base64.b64encode(str(v).encode()).decode()
        elif res == NAMESPACES:
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
        elif res.kind == "Service" and not res.group:
            spec = obj.setdefault("spec", {})
            spec.setdefault("type", "ClusterIP")
            spec.setdefault("sessionAffinity", "None")
            if not spec.get("clusterIP"):
                alloc = getattr(self, "allocate_cluster_ip", None)  # --pod-network bridged: podnet.py
                # host pod network: loopback only (documented deviation)
                spec["clusterIP"] = alloc() if alloc else "127.0.0.1"
            spec.setdefault("clusterIPs", [spec["clusterIP"]])
            for p in spec.get("ports") or []:
                p.setdefault("protocol", "TCP")
                p.setdefault("targetPort", p.get("port"))
            obj["status"] = {"loadBalancer": {}}
        elif res in self.custom:
            obj.pop("status", None)

    def replace(self, res: Resource, obj: dict, *, subresource: str = "", field_validation: str = "Ignore",
                check_rv: bool = True) -> dict:
        obj = copy.deepcopy(obj)
        md = obj.setdefault("metadata", {})
        ns = (md.get("namespace") or "default") if res.namespaced else ""
        key = (ns, md.get("name", ""))
        old = self.objects.get(res, {}).get(key)
        if old is None:
            raise not_found(res, md.get("name", ""))
        rv = md.get("resourceVersion")
        if check_rv and rv and rv != old["metadata"]["resourceVersion"]:
            raise conflict(res, key[1])
        obj["kind"], obj["apiVersion"] = res.kind, res.api_version
        has_status = res == PODS or res in self.custom or res == NAMESPACES or res == NODES
        if subresource == "status":
            new = copy.deepcopy(old)
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
            # status writes may also carry metadata labels/annotations changes in real k8s; ignore
        else:
            new = obj
            if has_status:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            self._validate(res, new, old, field_validation)
            nm = new["metadata"]
            for k in ("uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds"):
                if k in old["metadata"]:
                    nm[k] = old["metadata"][k]
                else:
                    nm.pop(k, None)
            if res.namespaced:
                nm["namespace"] = ns
            if res == PODS:
                new["spec"].setdefault("nodeName", old["spec"].get("nodeName")) if old["spec"].get("nodeName") else None
                for k, v in old["spec"].items():     # keep server defaults
                    new["spec"].setdefault(k, v)
            if {k: v for k, v in new.items() if k not in ("metadata", "status")} != \
                    {k: v for k, v in old.items() if k not in ("metadata", "status")}:
                nm["generation"] = old["metadata"].get("generation", 1) + 1
        if _same(new, old):
            return copy.deepcopy(old)
        new["metadata"]["resourceVersion"] = self._next_rv()
        self.objects[res][key] = new
        self._emit("MODIFIED", res, new, copy.deepcopy(old))
        self._maybe_finalize(res, new)
        return copy.deepcopy(new)

    def patch(self, res: Resource, ns: str | None, name: str, fn: Callable[[dict], dict], *,
              subresource: str = "", field_validation: str = "Ignore") -> dict:
        old = self.get(res, ns, name)
        if old is None:
            raise not_found(res, name)
        new = fn(copy.deepcopy(old))
        new.setdefault("metadata", {})
        new["metadata"]["name"] = name
        if res.namespaced:
            new["metadata"]["namespace"] = ns
        return self.replace(res, new, subresource=subresource, field_validation=field_validation, check_rv=True)

    def update_status(self, res: Resource, ns: str, name: str, status: dict) -> dict:
        cur = self.get(res, ns, name)
        if cur is None:
            raise not_found(res, name)
        cur["status"] = status
        cur["metadata"].pop("resourceVersion", None)
        return self.replace(res, cur, subresource="status")

    def patch_metadata(self, res: Resource, ns: str, name: str, *, labels: dict | None = None,
                       annotations: dict | None = None, finalizers: list | None = None) -> dict:
        cur = self.objects.get(res, {}).get((ns or "" if res.namespaced else "", name))
        if cur is None:
            raise not_found(res, name)
        old = copy.deepcopy(cur)
        md = cur["metadata"]
        for field, patch in (("labels", labels), ("annotations", annotations)):
            if patch:
                md[field] = json_merge_patch(md.get(field) or {}, patch)
        if finalizers is not None:
            if finalizers:
                md["finalizers"] = list(finalizers)
            else:
                md.pop("finalizers", None)
        if _same(cur, old):
            return copy.deepcopy(cur)
        md["resourceVersion"] = self._next_rv()
        self._emit("MODIFIED", res, cur, old)
        self._maybe_finalize(res, cur)
        return copy.deepcopy(cur)

    def delete(self, res: Resource, ns: str | None, name: str, grace_seconds: float | None = None,
               propagation: str = "Background") -> dict:
        key = (ns or "" if res.namespaced else "", name)
        cur = self.objects.get(res, {}).get(key)
        if cur is None:
            raise not_found(res, name)
        md = cur["metadata"]
        if propagation in ("Orphan", "Foreground"):  # the GC's own finalizers
            fin = "orphan" if propagation == "Orphan" else FOREGROUND
            md.setdefault("finalizers", [])
            if fin not in md["finalizers"]:
                md["finalizers"].append(fin)
        if res == PODS:
            spec_grace = cur["spec"].get("terminationGracePeriodSeconds", 30)
            grace = spec_grace if grace_seconds is None else grace_seconds
            if md.get("deletionTimestamp"):
                if grace < md.get("deletionGracePeriodSeconds", grace):
                    md["deletionGracePeriodSeconds"] = int(grace)
                    md["resourceVersion"] = self._next_rv()
                    self._emit("MODIFIED", res, cur, None)
                    if self.pod_deleter:
                        self.pod_deleter(copy.deepcopy(cur), grace)
                return copy.deepcopy(cur)
            running = bool(cur["spec"].get("nodeName")) and cur.get("status", {}).get("phase") not in ("Succeeded", "Failed")
            if grace > 0 and running and self.pod_deleter is not None:
                old = copy.deepcopy(cur)
                md["deletionTimestamp"] = now_rfc3339()
                md["deletionGracePeriodSeconds"] = int(grace)
                md["generation"] = md.get("generation", 1) + 1
                md["resourceVersion"] = self._next_rv()
                self._emit("MODIFIED", res, cur, old)
                self.pod_deleter(copy.deepcopy(cur), grace)
                return copy.deepcopy(cur)
            if self.pod_deleter is not None and cur["spec"].get("nodeName"):
                self.pod_deleter(copy.deepcopy(cur), 0)
        if md.get("finalizers"):
            if not md.get("deletionTimestamp"):
                old = copy.deepcopy(cur)
                md["deletionTimestamp"] = now_rfc3339()
                md["deletionGracePeriodSeconds"] = 0
                md["resourceVersion"] = self._next_rv()
                self._emit("MODIFIED", res, cur, old)
            self._maybe_finalize(res, cur)
            return copy.deepcopy(cur)
        return self.remove(res, ns, name)

    def _maybe_finalize(self, res: Resource, cur: dict) -> None:
        md = cur["metadata"]
        if not md.get("deletionTimestamp"):
            return
        fins = md.get("finalizers") or []
        if "orphan" in fins:                          # the GC's own finalizer
            self._orphan_dependents(md["uid"])
            md["finalizers"] = [f for f in fins if f != "orphan"]
            if not md["finalizers"]:
                md.pop("finalizers")
            fins = md.get("finalizers") or []
        if res == PODS and self.pod_deleter is not None and cur.get("spec", {}).get("nodeName") \
                and cur.get("status", {}).get("phase") not in ("Succeeded", "Failed") \
                and md["uid"] not in self.pods_stopped:
            return                                    # the kubelet removes it once its containers are gone
        if not fins:
            key = (md.get("namespace", ""), md["name"])
            if key in self.objects.get(res, {}):
                self.remove(res, md.get("namespace"), md["name"])

    def pod_stopped(self, ns: str, name: str, uid: str) -> None:
        """Kubelet: the pod's containers are gone; finish a pending graceful deletion."""
        self.pods_stopped.add(uid)
        cur = self.objects[PODS].get((ns, name))
        if cur is not None and cur["metadata"]["uid"] == uid:
            self._maybe_finalize(PODS, cur)

    def remove(self, res: Resource, ns: str | None, name: str) -> dict:
        """Remove the object now (final step of deletion) and garbage-collect its dependents."""
        key = (ns or "" if res.namespaced else "", name)
        cur = self.objects[res].pop(key, None)
        if cur is None:
            raise not_found(res, name)
        cur["metadata"]["resourceVersion"] = self._next_rv()
        self._emit("DELETED", res, cur, None)
        self.gc.owner_gone(cur)
        return copy.deepcopy(cur)

    def _dependents(self, uid: str):
        for r, objs in self.objects.items():
            for (ns, name), o in list(objs.items()):
                if any(ref.get("uid") == uid for ref in o["metadata"].get("ownerReferences") or []):
                    yield r, ns, name, o

    def _orphan_dependents(self, uid: str) -> None:
        for r, _ns, _name, o in list(self._dependents(uid)):
            self._set_owner_refs(r, o, [ref for ref in o["metadata"]["ownerReferences"] if ref.get("uid") != uid])

    def _set_owner_refs(self, r: Resource, o: dict, refs: list) -> None:
        old = copy.deepcopy(o)
        if refs:
            o["metadata"]["ownerReferences"] = refs
        else:
            o["metadata"].pop("ownerReferences", None)
        o["metadata"]["resourceVersion"] = self._next_rv()
        self._emit("MODIFIED", r, o, old)

    def subscribe(self, callback: WatchCallback) -> None:
        self.subscribers.append(callback)

    def record_event(self, involved: dict, reason: str, message: str, type_: str = "Normal",
                     component: str = "emulator") -> None:
        md = involved.get("metadata") or {}
        ns = md.get("namespace") or "default"
        if ("", ns) not in self.objects[NAMESPACES]:
            return
        ref = {"kind": involved.get("kind"), "namespace": ns, "name": md.get("name"), "uid": md.get("uid"),
               "apiVersion": involved.get("apiVersion"), "resourceVersion": md.get("resourceVersion")}
        now = now_rfc3339()
        for (ens, _ename), ev in self.objects[EVENTS].items():
            if ens == ns and ev["involvedObject"].get("uid") == ref["uid"] and ev["reason"] == reason \
                    and ev["message"] == message and ev.get("type") == type_:
                old = copy.deepcopy(ev)
                ev["count"] = ev.get("count", 1) + 1
                ev["lastTimestamp"] = now
                ev["metadata"]["resourceVersion"] = self._next_rv()
                self._emit("MODIFIED", EVENTS, ev, old)
                return
        ev = {"metadata": {"name": f"{md.get('name')}.{secrets.token_hex(8)}", "namespace": ns},
              "involvedObject": ref, "reason": reason, "message": message, "type": type_,
              "source": {"component": component}, "firstTimestamp": now, "lastTimestamp": now,
              "count": 1, "reportingComponent": component, "reportingInstance": ""}
        if component == "kubelet" and involved.get("spec", {}).get("nodeName"):
            ev["source"]["host"] = involved["spec"]["nodeName"]
        self.create(EVENTS, ev)

    def register_custom_resource(self, res: Resource, validate: Validator) -> None:
        self.custom[res] = validate
        self.objects.setdefault(res, {})

    def register_controller(self, start: Callable[[Any], Awaitable[None]]) -> None:
        self.controllers.append(start)

    # ------------------------------------------------------------ watch support
    def watch(self, res: Resource, ns: str | None, match: Callable[[dict], bool], since: int | None):
        """Returns (watcher, initial events). since=None: synthetic ADDED for current objects.
        Raises ApiError 410 when `since` is older than the kept history."""
        w = Watcher(res, ns, match)
        initial: list[tuple[str, dict]] = []
        if since is None:
            for (ons, _), o in sorted(self.objects.get(res, {}).items()):
                if ns and ons != ns:
                    continue
                if match(o):
                    initial.append(("ADDED", copy.deepcopy(o)))
        else:
            oldest = self.history[0][0] if self.history else self.rv + 1
            if since < oldest - 1 and len(self.history) == self.history.maxlen:
                raise ApiError(410, "Expired", f"too old resource version: {since} ({oldest - 1})")
            if since < self.compacted:
                raise ApiError(410, "Expired", f"too old resource version: {since} ({self.compacted})")
            for rv, t, r, o, prev in self.history:
                if rv > since and r == res:
                    w.offer(t, o, prev)
        self.watchers.append(w)
        return w, initial

    def end_watches(self, plural: str | None, expire: bool) -> int:
        """End every open watch (of `plural`, or all), as a restarted or overloaded API server ends
        them; `expire`: etcd compacted everything up to now as well, so each stream first gets the
        ERROR event with the 410 Status the real server sends, and a resume from an older
        resourceVersion gets 410 Gone (the client must list again). Returns how many ended."""
        if expire:
            self.compacted = self.rv
        ended = 0
        for w in list(self.watchers):
            if plural in (None, w.res.plural):
                gone = ApiError(410, "Expired", f"too old resource version: {self.compacted} ({self.rv})")
                w.queue.put_nowait((Watcher.END, gone.status() if expire else None))
                ended += 1
        return ended

    def unwatch(self, w: Watcher) -> None:
        if w in self.watchers:
            self.watchers.remove(w)


def _same(a: dict, b: dict) -> bool:
    a = copy.deepcopy(a)
    b = copy.deepcopy(b)
    a["metadata"].pop("resourceVersion", None)
    b["metadata"].pop("resourceVersion", None)
    return a == b


def _qos(spec: dict) -> str:
    cs = spec.get("containers") or []
    req = [c.get("resources", {}).get("requests") or {} for c in cs]
    lim = [c.get("resources", {}).get("limits") or {} for c in cs]
    if not any(req) and not any(lim):
        return "BestEffort"
    if all(li.get("cpu") and li.get("memory") and r.get("cpu", li["cpu"]) == li["cpu"]
           and r.get("memory", li["memory"]) == li["memory"] for r, li in zip(req, lim)):
        return "Guaranteed"
    return "Burstable"
