"""One owner object per experiment, so that nothing outlives it in the cluster.

A ConfigMap `nni-exp-<id>` is made first; every object the experiment makes in its namespace
(the relay's ConfigMap, Pod and Service, the agent ConfigMap, the image pull Secret, each
environment's Secret and main object, the probe pods, FrameworkController's ServiceAccount,
Role and RoleBinding) names it in `metadata.ownerReferences`. Deleting it lets the cluster's
garbage collector delete the rest (and what their operators made: TFJob pods, ...), also after
the manager died: `nni-manager cleanup ID` or `--all-orphans` does that. The dependency
ConfigMaps are a cache shared by experiments (deps.py) and are not owned.
"""
from __future__ import annotations

import asyncio
import copy
import logging
import time
from typing import Any

from nni_manager.backends.kubernetes.client import api_error

log = logging.getLogger(__name__)

APP = "nni-experiment"


def owner_name(experiment_id: str) -> str:
    return f"nni-exp-{experiment_id.lower()}"


def owner_object(experiment_id: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": owner_name(experiment_id), "namespace": namespace,
                         "labels": {"app": APP, "expId": experiment_id}},
            "data": {"experiment": experiment_id,
                     "note": "deleting this ConfigMap deletes every object of the NNI experiment (ownerReferences)"}}


def reference(name: str, uid: str) -> dict[str, Any]:
    """The ownerReference naming the owner ConfigMap (not a controller: nothing reconciles it)."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": uid,
            "controller": False, "blockOwnerDeletion": False}


def adopt(obj: dict[str, Any], ref: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of `obj` that also names `ref` as an owner (unchanged without one: the dry run)."""
    if ref is None:
        return obj
    out = copy.deepcopy(obj)
    refs = [r for r in out["metadata"].get("ownerReferences") or [] if r.get("uid") != ref["uid"]]
    out["metadata"]["ownerReferences"] = [*refs, ref]
    return out


async def ensure(core: Any, namespace: str, experiment_id: str) -> dict[str, Any]:
    """Create the owner ConfigMap (or take it again after a restart, by `update`: the minimal Role
    has no `get` on ConfigMaps); its ownerReference."""
    body = owner_object(experiment_id, namespace)
    name = body["metadata"]["name"]
    try:
        made = await core.create_namespaced_config_map(namespace, body, field_validation="Strict")
    except Exception as e:
        if getattr(e, "status", None) != 409:
            raise api_error(e, f"creating the experiment's owner ConfigMap {name}") from None
        try:
            made = await core.replace_namespaced_config_map(name, namespace, body)
        except Exception as again:
            raise api_error(again, f"updating the experiment's owner ConfigMap {name}") from None
    return reference(name, made.metadata.uid)


async def delete(core: Any, namespace: str, experiment_id: str) -> bool:
    """Delete the owner (the garbage collector takes its dependents); False when it was gone."""
    from kubernetes.aio.client.exceptions import ApiException

    name = owner_name(experiment_id)
    try:  # the answer (a Status, or the object, by server version) is not parsed, only its status
        answer = await core.delete_namespaced_config_map_without_preload_content(
            name, namespace, propagation_policy="Background")
        body = await answer.read()  # read to the end: the connection goes back to the pool
        if answer.status == 404:
            return False
        if not 200 <= answer.status < 300:
            raise ApiException(status=answer.status, reason=answer.reason, body=body.decode(errors="replace"))
    except Exception as e:
        raise api_error(e, f"deleting the experiment's owner ConfigMap {name}") from None
    return True


async def remaining(core: Any, namespace: str, experiment_id: str, timeout: float) -> list[str]:
    """The experiment's objects (by its labels) still present after up to `timeout` seconds of
    garbage collection and pod grace periods: 'Kind/name'."""
    deadline = time.monotonic() + timeout
    while True:
        left: list[str] = []
        for app in ("nni-kubernetes-trial", "nni-hub-relay", APP):
            sel = f"app={app},expId={experiment_id}"
            for kind, lister in (("Pod", core.list_namespaced_pod), ("Secret", core.list_namespaced_secret),
                                 ("ConfigMap", core.list_namespaced_config_map),
                                 ("Service", core.list_namespaced_service)):
                try:
                    items = (await lister(namespace, label_selector=sel)).items
                except Exception as e:  # may not list one kind: say nothing of it
                    if getattr(e, "status", None) in (401, 403):
                        continue
                    raise api_error(e, f"listing {kind}s in namespace {namespace}") from None
                left += [f"{kind}/{o.metadata.name}" for o in items]
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.5)


async def sweep_expired(core: Any, namespace: str, experiment_id: str) -> list[str]:
    """Delete the owners of other experiments whose relay ended by itself (its pod Succeeded: its
    manager was gone for the whole reconnectWindow, and its agents gave up), so the next run in a
    namespace removes what a dead manager left. Only an owner the relay names, by its uid (one
    made again meanwhile by a resumed manager is kept). The ids swept; nothing when pods cannot be
    listed."""
    from kubernetes.aio.client import V1DeleteOptions, V1Preconditions

    try:
        relays = (await core.list_namespaced_pod(namespace, label_selector="app=nni-hub-relay")).items
    except Exception as e:  # a courtesy: `nni-manager cleanup` does the same by hand
        log.debug("listing relay pods to find expired experiments: %s", e)
        return []
    swept = []
    for pod in relays:
        gone = (pod.metadata.labels or {}).get("expId", "")
        if not gone or gone == experiment_id or pod.status is None or pod.status.phase != "Succeeded":
            continue
        refs = [r for r in pod.metadata.owner_references or [] if r.kind == "ConfigMap" and r.name == owner_name(gone)]
        if not refs:
            continue
        try:
            answer = await core.delete_namespaced_config_map_without_preload_content(
                owner_name(gone), namespace, propagation_policy="Background",
                body=V1DeleteOptions(preconditions=V1Preconditions(uid=refs[0].uid)))
            await answer.read()
        except Exception as e:
            log.debug("deleting the owner of expired experiment %s: %s", gone, e)
            continue
        if not 200 <= answer.status < 300:  # gone already (404), or made again meanwhile (409)
            continue
        log.info("deleted what experiment %s left in namespace %s: its manager was gone for its whole "
                 "reconnectWindow (its hub relay ended)", gone, namespace)
        swept.append(gone)
    return swept
