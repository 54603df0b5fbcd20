"""The emulator's garbage collector follows the real one's ownerReferences rules (the Kubernetes
docs' "Garbage Collection" and "Owners and Dependents" pages, kube-controller-manager's
garbagecollector.go), driven through the official client: background deletion of dependents
whose owner is gone, the owner's uid must match (a same-named successor is not the owner), a
namespaced owner only in the dependent's namespace, cluster-scoped owners of namespaced
dependents, a cluster-scoped dependent of a namespaced kind never collected, Orphan and
Foreground propagation, and the API server's validation of the references."""
from __future__ import annotations

import time
from typing import Any

import pytest

NS = "default"


@pytest.fixture(scope="module")
def k8s(tmp_path_factory):
    """One emulator for this module (the rules need no pods)."""
    import os

    if os.geteuid() != 0:
        pytest.skip("the Kubernetes emulator needs root (mount namespaces for pod volumes)")
    from tests.support.emulators import emulator_factory
    from tests.support.kube.fixtures import start_emulator

    with emulator_factory("kube-emu-", start_emulator, "the Kubernetes emulator") as make:
        yield make(namespaces=["other"])


def _apis(kube: Any):
    from kubernetes import client

    api = kube.api_client()
    return client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)


def _ref(obj: Any, kind: str = "ConfigMap", api_version: str = "v1", **extra: Any) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": obj.metadata.name, "uid": obj.metadata.uid, **extra}


def _cm(core: Any, name: str, ns: str = NS, owners: list[dict[str, Any]] | None = None) -> Any:
    md: dict[str, Any] = {"name": name}
    if owners:
        md["ownerReferences"] = owners
    return core.create_namespaced_config_map(ns, {"metadata": md, "data": {"k": "v"}})


def _exists(read: Any, *args: Any) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        read(*args)
    except ApiException as e:
        assert e.status == 404, e
        return False
    return True


def _stays(cond: Any, seconds: float = 1.5) -> bool:
    """`cond` holds for `seconds` (the collector works within a fraction of that)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not cond():
            return False
        time.sleep(0.1)
    return True


def test_background_deletion_takes_dependents_and_keeps_those_with_another_owner(k8s) -> None:
    core, _ = _apis(k8s)
    owner, other = _cm(core, "bg-owner"), _cm(core, "bg-other")
    only = _cm(core, "bg-only", owners=[_ref(owner)])
    grand = _cm(core, "bg-grand", owners=[_ref(only)])  # a chain: owner -> only -> grand
    shared = _cm(core, "bg-shared", owners=[_ref(owner), _ref(other)])
    assert _stays(lambda: _exists(core.read_namespaced_config_map, "bg-only", NS))  # a present owner: kept
    core.delete_namespaced_config_map("bg-owner", NS)  # Background is the default
    k8s.wait_for(lambda: not _exists(core.read_namespaced_config_map, only.metadata.name, NS), 10, what="dependent")
    k8s.wait_for(lambda: not _exists(core.read_namespaced_config_map, grand.metadata.name, NS), 10, what="chain")
    kept = core.read_namespaced_config_map(shared.metadata.name, NS)
    assert [r.uid for r in kept.metadata.owner_references] == [other.metadata.uid]  # only the absent one went


def test_the_owner_uid_must_match(k8s) -> None:
    """A reference naming an existing object by name but with another uid (the object was
    re-created) points at an absent owner: the dependent is collected; the right uid keeps it."""
    core, _ = _apis(k8s)
    owner = _cm(core, "uid-owner")
    wrong = dict(_ref(owner), uid="6c0b3c1e-0000-4000-8000-000000000000")
    _cm(core, "uid-wrong", owners=[wrong])
    _cm(core, "uid-right", owners=[_ref(owner)])
    k8s.wait_for(lambda: not _exists(core.read_namespaced_config_map, "uid-wrong", NS), 10, what="wrong uid collected")
    assert _stays(lambda: _exists(core.read_namespaced_config_map, "uid-right", NS))
    core.delete_namespaced_config_map("uid-owner", NS)
    _cm(core, "uid-owner")  # a successor under the same name is not the owner
    k8s.wait_for(lambda: not _exists(core.read_namespaced_config_map, "uid-right", NS), 10, what="successor")


def test_a_namespaced_owner_counts_only_in_the_dependents_namespace(k8s) -> None:
    core, _ = _apis(k8s)
    owner = _cm(core, "xns-owner", ns="other")
    _cm(core, "xns-dependent", owners=[_ref(owner)])  # in default, naming an owner in `other`
    k8s.wait_for(lambda: not _exists(core.read_namespaced_config_map, "xns-dependent", NS), 10,
                 what="cross-namespace reference treated as absent")
    reasons = [e.reason for e in core.list_namespaced_event(NS).items if e.involved_object.name == "xns-dependent"]
    assert "OwnerRefInvalidNamespace" in reasons
    assert _exists(core.read_namespaced_config_map, "xns-owner", "other")


def test_cluster_scoped_owners_and_dependents(k8s) -> None:
    """A namespaced dependent may have a cluster-scoped owner (collected when it goes); a
    cluster-scoped dependent naming a namespaced kind is invalid and never collected."""
    core, rbac = _apis(k8s)
    role = rbac.create_cluster_role({"metadata": {"name": "gc-owner-role"}, "rules": []})
    dependent = _cm(core, "cs-dependent", owners=[_ref(role, "ClusterRole", "rbac.authorization.k8s.io/v1")])
    ns_owner = _cm(core, "cs-ns-owner")
    invalid = rbac.create_cluster_role({"metadata": {"name": "gc-invalid-dependent", "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "cs-ns-owner", "uid": ns_owner.metadata.uid}]}, "rules": []})
    assert _stays(lambda: _exists(core.read_namespaced_config_map, dependent.metadata.name, NS))
    rbac.delete_cluster_role("gc-owner-role")
    k8s.wait_for(lambda: not _exists(core.read_namespaced_config_map, dependent.metadata.name, NS), 10,
                 what="dependent of a cluster-scoped owner")
    core.delete_namespaced_config_map("cs-ns-owner", NS)
    assert _stays(lambda: _exists(rbac.read_cluster_role, invalid.metadata.name))  # never collected


def test_orphan_and_foreground_propagation(k8s) -> None:
    from kubernetes import client

    core, _ = _apis(k8s)
    owner = _cm(core, "orph-owner")
    kept = _cm(core, "orph-dependent", owners=[_ref(owner)])
    core.delete_namespaced_config_map("orph-owner", NS, body=client.V1DeleteOptions(propagation_policy="Orphan"))
    k8s.wait_for(lambda: not _exists(core.read_namespaced_config_map, "orph-owner", NS), 10, what="owner gone")
    assert _stays(lambda: _exists(core.read_namespaced_config_map, kept.metadata.name, NS))
    assert not core.read_namespaced_config_map(kept.metadata.name, NS).metadata.owner_references

    owner = _cm(core, "fg-owner")
    # a blocking dependent that cannot go yet (a finalizer of someone else's), and a loose one
    core.create_namespaced_config_map(NS, {"metadata": {"name": "fg-dependent", "finalizers": ["example.com/hold"],
                                                        "ownerReferences": [_ref(owner, blockOwnerDeletion=True)]}})
    _cm(core, "fg-loose", owners=[_ref(owner)])
    core.delete_namespaced_config_map("fg-owner", NS, body=client.V1DeleteOptions(propagation_policy="Foreground"))
    k8s.wait_for(lambda: not _exists(core.read_namespaced_config_map, "fg-loose", NS), 10, what="loose dependent")
    held = core.read_namespaced_config_map("fg-dependent", NS)
    assert held.metadata.deletion_timestamp is not None  # being deleted, held by its finalizer
    waiting = core.read_namespaced_config_map("fg-owner", NS)  # the owner waits for it
    assert waiting.metadata.deletion_timestamp is not None and "foregroundDeletion" in waiting.metadata.finalizers
    held.metadata.finalizers = []
    core.replace_namespaced_config_map("fg-dependent", NS, held)
    k8s.wait_for(lambda: not _exists(core.read_namespaced_config_map, "fg-owner", NS), 10, what="owner gone last")
    assert not _exists(core.read_namespaced_config_map, "fg-dependent", NS)


def test_the_api_server_validates_owner_references(k8s) -> None:
    from kubernetes.client.exceptions import ApiException

    core, _ = _apis(k8s)
    owner = _cm(core, "val-owner")
    for bad, words in (({**_ref(owner), "uid": ""}, "uid must not be empty"),
                       ({**_ref(owner), "apiVersion": ""}, "version must not be empty"),
                       ({"apiVersion": "v1", "kind": "Event", "name": "e", "uid": "u"}, "disallowed from being an owner")):
        with pytest.raises(ApiException) as err:
            _cm(core, "val-bad", owners=[bad])
        assert err.value.status == 422 and words in err.value.body, err.value.body
    with pytest.raises(ApiException) as err:
        _cm(core, "val-two", owners=[_ref(owner, controller=True), _ref(owner, controller=True, name="x")])
    assert err.value.status == 422 and "Only one reference can have Controller set to true" in err.value.body
