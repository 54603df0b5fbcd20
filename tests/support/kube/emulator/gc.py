"""The garbage collector's `ownerReferences` rules, as kube-controller-manager's garbagecollector
(pkg/controller/garbagecollector/garbagecollector.go) and the API server's metadata validation
(apimachinery/pkg/api/validation/objectmeta.go) apply them; see also
https://kubernetes.io/docs/concepts/architecture/garbage-collection/ and
https://kubernetes.io/docs/concepts/overview/working-with-objects/owners-dependents/.

- An owner reference is resolved by its apiVersion's group and its kind to a resource, then by
  name: in the dependent's namespace for a namespaced owner kind, cluster-wide otherwise. The
  owner is absent when no object has that name, or the one that has it has another uid (`isDangling`).
- A cluster-scoped dependent naming a namespaced owner kind is invalid: never collected (an
  `OwnerRefInvalidNamespace` warning event); an unknown owner kind is never collected either.
- A dependent with at least one present owner loses only its absent references; one whose owners
  are all absent is deleted (background deletion, or as its own finalizers say).
- Collection is asynchronous: a dependent is looked at when an owner goes, and whenever an object
  with ownerReferences is created or changed (an owner that never existed counts as absent).
- Foreground deletion of an owner (`propagationPolicy: Foreground`): the owner gets the
  `foregroundDeletion` finalizer and a deletionTimestamp, its dependents are deleted, and the owner
  goes once no dependent with `blockOwnerDeletion: true` remains.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .api import EVENTS, ApiError, FieldError, Resource

if TYPE_CHECKING:
    from .store import Store

FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"
DELAY_S = 0.2  # the controller works from its informers' events, a moment after the change


def validate_owner_references(md: dict) -> list[FieldError]:
    """ValidateOwnerReferences: apiVersion's version, kind, name and uid are required; at most
    one reference is the controller; an Event may not own anything."""
    errs: list[FieldError] = []
    refs = md.get("ownerReferences") or []
    first_controller = ""
    for ref in refs:
        api_version = str(ref.get("apiVersion") or "")
        version = api_version.rsplit("/", 1)[-1] if api_version else ""
        for field, value, what in (("apiVersion", version, "version"), ("kind", ref.get("kind"), "kind"),
                                   ("name", ref.get("name"), "name"), ("uid", ref.get("uid"), "uid")):
            if not value:
                errs.append(FieldError(f"metadata.ownerReferences.{field}", "FieldValueInvalid",
                                       f'Invalid value: "{ref.get(field) or ""}": {what} must not be empty'))
        if api_version == "v1" and ref.get("kind") == "Event":
            errs.append(FieldError("metadata.ownerReferences", "FieldValueInvalid",
                                   "Invalid value: \"\": /v1, Kind=Event is disallowed from being an owner"))
        if ref.get("controller") is True:
            name = f"{ref.get('kind')}/{ref.get('name')}"
            if first_controller:
                errs.append(FieldError("metadata.ownerReferences", "FieldValueInvalid",
                                       "Invalid value: []: Only one reference can have Controller set to true. Found "
                                       f'"true" in references for {first_controller} and {name}'))
            else:
                first_controller = name
    return errs


class GarbageCollector:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.pending: set[tuple[Resource, str, str]] = set()

    # ------------------------------------------------------------ when to look
    def changed(self, res: Resource, obj: dict) -> None:
        """An object was created or changed: its owners are looked up a moment later."""
        md = obj.get("metadata") or {}
        if md.get("ownerReferences"):
            self._later(res, md.get("namespace", ""), md["name"])
        if FOREGROUND in (md.get("finalizers") or []) and md.get("deletionTimestamp"):
            self._later(res, md.get("namespace", ""), md["name"])

    def owner_gone(self, owner: dict) -> None:
        """An object was removed: every object naming its uid is looked at (at once, as the
        collector's graph knows its dependents), and a foreground deletion waiting on it is retried."""
        uid = owner["metadata"]["uid"]
        for res, ns, name, _ in list(self._dependents(uid)):
            self.attempt(res, ns, name)
        for res, objs in list(self.store.objects.items()):
            for (ns, name), o in list(objs.items()):
                md = o["metadata"]
                if FOREGROUND in (md.get("finalizers") or []) and md.get("deletionTimestamp"):
                    self._finish_foreground(res, ns, name)

    def _later(self, res: Resource, ns: str, name: str) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.attempt(res, ns, name)
            return
        key = (res, ns, name)
        if key not in self.pending:
            self.pending.add(key)
            loop.call_later(DELAY_S, self._run, key)

    def _run(self, key: tuple[Resource, str, str]) -> None:
        self.pending.discard(key)
        res, ns, name = key
        cur = self.store.objects.get(res, {}).get((ns, name))
        if cur is not None and FOREGROUND in (cur["metadata"].get("finalizers") or []) \
                and cur["metadata"].get("deletionTimestamp"):
            self._delete_dependents(cur)
            self._finish_foreground(res, ns, name)
        if (ns, name) in self.store.objects.get(res, {}):
            self.attempt(res, ns, name)

    # ------------------------------------------------------------ attemptToDeleteItem
    def attempt(self, res: Resource, ns: str, name: str) -> None:
        cur = self.store.objects.get(res, {}).get((ns, name))
        if cur is None:
            return
        md = cur["metadata"]
        refs = md.get("ownerReferences") or []
        if not refs or md.get("deletionTimestamp"):
            return
        solid, dangling, waiting = [], [], []
        for ref in refs:
            verdict = self._owner_state(res, cur, ref)
            if verdict is None:  # unresolvable (unknown kind, a namespaced owner of a cluster-scoped object)
                return
            if verdict == "absent":
                dangling.append(ref)
            elif verdict == "deleting-foreground" and ref.get("blockOwnerDeletion"):
                waiting.append(ref)
            else:
                solid.append(ref)
        if solid:
            if dangling or waiting:  # only the absent references go
                gone = {r.get("uid") for r in dangling + waiting}
                self.store._set_owner_refs(res, cur, [r for r in refs if r.get("uid") not in gone])
            return
        fins = md.get("finalizers") or []
        propagation = "Orphan" if ORPHAN in fins else "Foreground" if FOREGROUND in fins or waiting else "Background"
        try:
            self.store.delete(res, ns or None, name, propagation=propagation)
        except ApiError:
            pass

    def _owner_state(self, res: Resource, dependent: dict, ref: dict) -> str | None:
        """'present', 'absent', 'deleting-foreground', or None when the reference cannot be resolved."""
        owner_res = self._resource(str(ref.get("apiVersion") or ""), str(ref.get("kind") or ""))
        if owner_res is None:
            return None
        ns = dependent["metadata"].get("namespace", "")
        if owner_res.namespaced and not res.namespaced:
            self.store.record_event(dependent, "OwnerRefInvalidNamespace",
                                    f"ownerRef [{owner_res.api_version}/{owner_res.kind}, namespace: , name: "
                                    f"{ref.get('name')}, uid: {ref.get('uid')}] does not exist in namespace \"\"",
                                    "Warning", "garbage-collector-controller")
            return None
        owner = self.store.objects[owner_res].get((ns if owner_res.namespaced else "", str(ref.get("name"))))
        if owner is None or owner["metadata"]["uid"] != ref.get("uid"):
            if owner_res.namespaced and self._uid_elsewhere(owner_res, ref.get("uid"), ns):
                self.store.record_event(dependent, "OwnerRefInvalidNamespace",
                                        f"ownerRef [{owner_res.api_version}/{owner_res.kind}, namespace: {ns}, name: "
                                        f"{ref.get('name')}, uid: {ref.get('uid')}] does not exist in namespace "
                                        f'"{ns}"', "Warning", "garbage-collector-controller")
            return "absent"
        omd = owner["metadata"]
        if omd.get("deletionTimestamp") and FOREGROUND in (omd.get("finalizers") or []):
            return "deleting-foreground"
        return "present"

    def _resource(self, api_version: str, kind: str) -> Resource | None:
        group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
        for r in self.store.objects:
            if r.group == group and r.kind == kind and r != EVENTS:
                return r
        return None

    def _uid_elsewhere(self, res: Resource, uid: Any, ns: str) -> bool:
        return any(o["metadata"].get("uid") == uid for (ons, _), o in self.store.objects[res].items() if ons != ns)

    def _dependents(self, uid: str):
        for r, objs in self.store.objects.items():
            for (ns, name), o in list(objs.items()):
                if any(ref.get("uid") == uid for ref in o["metadata"].get("ownerReferences") or []):
                    yield r, ns, name, o

    # ------------------------------------------------------------ foreground deletion
    def _delete_dependents(self, owner: dict) -> None:
        for res, ns, name, o in list(self._dependents(owner["metadata"]["uid"])):
            if not o["metadata"].get("deletionTimestamp"):
                try:
                    self.store.delete(res, ns or None, name, propagation="Background")
                except ApiError:
                    pass

    def _finish_foreground(self, res: Resource, ns: str, name: str) -> None:
        cur = self.store.objects.get(res, {}).get((ns, name))
        if cur is None:
            return
        uid = cur["metadata"]["uid"]
        blocking = [o for _, _, _, o in self._dependents(uid)
                    if any(r.get("uid") == uid and r.get("blockOwnerDeletion") for r in o["metadata"]["ownerReferences"])]
        if not blocking:
            fins = [f for f in cur["metadata"].get("finalizers") or [] if f != FOREGROUND]
            self.store.patch_metadata(res, ns or "", name, finalizers=fins)
