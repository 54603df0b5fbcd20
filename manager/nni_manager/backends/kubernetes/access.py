"""What the experiment may do in its namespace, asked at start (SelfSubjectAccessReview), so a
missing RBAC grant is one line naming verb, resource and namespace instead of a failure mid-run.

`role_yaml` writes the smallest Role that grants a platform everything it needs; the same rules
are in docs/platforms/kubernetes.md (a test applies that Role and runs experiments under it).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from kubernetes.aio.client import ApiClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Need:
    verb: str
    resource: str  # plural, or plural/subresource (pods/portforward)
    group: str = ""

    def line(self, namespace: str) -> str:
        where = f"{self.resource}.{self.group}" if self.group else self.resource
        return f"cannot {self.verb} {where} in namespace {namespace}"


def _needs(verbs: str, resource: str, group: str = "") -> list[Need]:
    return [Need(v, resource, group) for v in verbs.split()]


def platform_needs(custom: tuple[str, str, str, str] | None) -> list[Need]:
    """Every verb one platform's experiment uses: plain pods create their pods, the operator
    platforms their custom resource (the operator makes the pods)."""
    out = _needs("get list watch delete deletecollection", "pods")
    out += _needs("list", "events")  # why an environment waits (quota, webhook, mounts)
    out += _needs("create patch delete deletecollection", "secrets")
    out += _needs("create update delete deletecollection", "configmaps")
    if custom is None:
        out += _needs("create", "pods")
    else:
        group, _, plural, _ = custom
        out += _needs("create get list delete deletecollection", plural, group)
    return out


def tunnel_needs() -> list[Need]:
    """What the hub tunnel adds (hubTunnel): its relay pod, Service and program, and the
    port-forward to the pod, which `create` on pods never grants. The tunnel's WebSocket upgrade is
    a GET, authorized as `get` on pods/portforward; from 1.35 the API server also checks `create`
    (AuthorizePodWebsocketUpgradeCreatePermission), as it always did for SPDY's POST."""
    out = _needs("create get delete", "pods")
    out += _needs("create get delete", "services")
    out += _needs("get create", "pods/portforward")
    return out


async def allowed(api: ApiClient, namespace: str, need: Need) -> bool:
    from kubernetes.aio import client

    attrs: dict[str, Any] = {"namespace": namespace, "verb": need.verb, "group": need.group}
    attrs["resource"], _, sub = need.resource.partition("/")
    if sub:
        attrs["subresource"] = sub
    review = await client.AuthorizationV1Api(api).create_self_subject_access_review(  # a dict body is sent as is
        {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",  # type: ignore[arg-type]
         "spec": {"resourceAttributes": attrs}})
    return bool(review.status and review.status.allowed)


async def missing(api: ApiClient, namespace: str, needs: list[Need]) -> list[Need] | None:
    """The needs the cluster denies, or None when it cannot say (no SelfSubjectAccessReview)."""
    try:
        answers = await asyncio.gather(*(allowed(api, namespace, n) for n in needs))
    except Exception as e:  # a cluster without the authorization API: the calls will tell
        if getattr(e, "status", None) in (None, 401):  # unreachable, or refused credentials: say so now
            from nni_manager.backends.kubernetes.client import api_error

            raise api_error(e, "checking permissions") from None
        log.info("cannot check permissions with SelfSubjectAccessReview: %s", e)
        return None
    return [n for n, ok in zip(needs, answers) if not ok]


def role_rules(needs: list[Need]) -> list[dict[str, Any]]:
    """RBAC rules granting `needs`: one rule per (group, resource), verbs in first-use order."""
    rules: dict[tuple[str, str], list[str]] = {}
    for n in needs:
        verbs = rules.setdefault((n.group, n.resource), [])
        if n.verb not in verbs:
            verbs.append(n.verb)
    return [{"apiGroups": [g], "resources": [r], "verbs": v} for (g, r), v in rules.items()]


def role_yaml(name: str, namespace: str, needs: list[Need]) -> str:
    return yaml.safe_dump({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                           "metadata": {"name": name, "namespace": namespace}, "rules": role_rules(needs)},
                          sort_keys=False)
