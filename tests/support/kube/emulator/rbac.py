"""RBAC as the API server's authorizer evaluates it, service-account tokens, expiring user tokens.

- Roles / RoleBindings / ClusterRoles / ClusterRoleBindings (rbac.authorization.k8s.io/v1) are
  stored objects; a request by a user under RBAC is allowed when a rule of a role bound to the user,
  one of its groups or its service account grants the verb on the resource (subresources as
  `pods/log`, `pods/portforward`), API group, namespace and (optionally) resource name.
- Every authenticated user may create SelfSubjectAccessReviews (system:basic-user).
- Service-account tokens name `system:serviceaccount:<ns>:<name>` (groups `system:serviceaccounts`,
  `system:serviceaccounts:<ns>`, `system:authenticated`); a token stops working when its account is
  deleted. The `default` account exists in every namespace, as the ServiceAccount controller makes it.
- Issued user tokens (an exec plugin's) expire at their `expirationTimestamp`: afterwards 401.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from .api import SERVICEACCOUNTS, Resource

GROUP = "rbac.authorization.k8s.io"
ROLES = Resource(GROUP, "v1", "roles", "Role")
ROLEBINDINGS = Resource(GROUP, "v1", "rolebindings", "RoleBinding")
CLUSTERROLES = Resource(GROUP, "v1", "clusterroles", "ClusterRole", namespaced=False)
CLUSTERROLEBINDINGS = Resource(GROUP, "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False)
RESOURCES = [ROLES, ROLEBINDINGS, CLUSTERROLES, CLUSTERROLEBINDINGS]
SA_PREFIX = "system:serviceaccount:"


@dataclass
class Identity:
    """Who a request is from: `rules` None means unrestricted (cluster-admin), a list the emulator's
    own rule syntax (--token), `rbac` True evaluation of the stored RBAC objects."""

    user: str
    rules: list | None = None
    rbac: bool = False
    groups: list[str] = field(default_factory=list)
    expires: float | None = None  # time.time() after which the token is refused


class Tokens:
    """Bearer tokens the emulator accepts beyond --token: service-account and issued user tokens."""

    def __init__(self) -> None:
        self.issued: dict[str, Identity] = {}
        self.accounts: dict[str, tuple[str, str]] = {}

    def service_account_token(self, ns: str, name: str) -> str:
        """The token a pod running as `ns/name` finds in its projected token volume."""
        for tok, key in self.accounts.items():
            if key == (ns, name):
                return tok
        tok = "sa-" + secrets.token_urlsafe(24)
        self.accounts[tok] = (ns, name)
        return tok

    def issue(self, user: str, lifetime: float, rbac: bool) -> tuple[str, float]:
        tok = "exec-" + secrets.token_urlsafe(24)
        expires = time.time() + lifetime
        self.issued[tok] = Identity(user, None, rbac, ["system:authenticated"], expires)
        return tok, expires

    def identify(self, store, token: str) -> Identity | None:
        ident = self.issued.get(token)
        if ident is not None:
            return ident if ident.expires is None or time.time() < ident.expires else None
        account = self.accounts.get(token)
        if account is not None:
            ns, name = account
            if name != "default" and store.get(SERVICEACCOUNTS, ns, name) is None:
                return None  # a bound token dies with its account
            return Identity(f"{SA_PREFIX}{ns}:{name}", None, True,
                            ["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"])
        return None


def _subject_matches(subject: dict, ident: Identity, binding_ns: str | None) -> bool:
    kind = subject.get("kind")
    if kind == "User":
        return subject.get("name") == ident.user
    if kind == "Group":
        return subject.get("name") in ident.groups
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or binding_ns or ""
        return ident.user == f"{SA_PREFIX}{ns}:{subject.get('name')}"
    return False


def _rule_allows(rule: dict, verb: str, resource: str, group: str, name: str | None) -> bool:
    if not any(v in ("*", verb) for v in rule.get("verbs") or []):
        return False
    if not any(g in ("*", group) for g in rule.get("apiGroups") or []):
        return False
    base, _, sub = resource.partition("/")
    ok = False
    for r in rule.get("resources") or []:
        if r == "*" or r == resource or (sub and r == f"{base}/*") or (sub and r == f"*/{sub}"):
            ok = True
    if not ok:
        return False
    names = rule.get("resourceNames") or []
    return not names or (name is not None and name in names)


def authorize(store, ident: Identity, verb: str, resource: str, group: str, ns: str | None,
              name: str | None = None) -> bool:
    """RBAC's decision for one request (resource may carry a subresource: `pods/portforward`)."""
    if ident.rules is None and not ident.rbac:
        return True
    if not ident.rbac:
        # a static token's rule on a resource covers its subresources, except pods/portforward,
        # which Kubernetes authorises on its own (`create` on pods never grants it)
        parent = () if resource.endswith("/portforward") else (resource.split("/")[0],)
        return any(v in ("*", verb) and r in ("*", resource, *parent) and g in ("*", group)
                   and (n == "*" or n == (ns or "")) for v, r, g, n in ident.rules or [])
    bindings: list[tuple[dict, str | None]] = [(b, None) for b in store.list(CLUSTERROLEBINDINGS)]
    if ns:
        bindings += [(b, ns) for b in store.list(ROLEBINDINGS, ns)]
    for binding, bns in bindings:
        if not any(_subject_matches(s, ident, bns) for s in binding.get("subjects") or []):
            continue
        ref = binding.get("roleRef") or {}
        role = (store.get(CLUSTERROLES, None, ref.get("name", "")) if ref.get("kind") == "ClusterRole"
                else store.get(ROLES, bns, ref.get("name", "")) if bns else None)
        if role is None:
            continue
        if any(_rule_allows(rule, verb, resource, group, name) for rule in role.get("rules") or []):
            return True
    return False


def access_review(store, ident: Identity, spec: dict) -> dict:
    """The status of a SelfSubjectAccessReview for `spec.resourceAttributes`."""
    attrs = spec.get("resourceAttributes")
    if not isinstance(attrs, dict):
        return {"allowed": False, "reason": "only resourceAttributes are emulated"}
    resource = attrs.get("resource", "") + (f"/{attrs['subresource']}" if attrs.get("subresource") else "")
    allowed = authorize(store, ident, attrs.get("verb", ""), resource, attrs.get("group", ""),
                        attrs.get("namespace") or None, attrs.get("name") or None)
    out: dict = {"allowed": allowed}
    if allowed and ident.rbac:
        out["reason"] = "RBAC: allowed by a role binding"
    return out


def escalation(store, ident: Identity, obj: dict, kind: str, ns: str | None) -> str | None:
    """RBAC's escalation prevention: a Role may only grant what its creator holds (or `escalate`),
    a RoleBinding only bind a role whose rules its creator holds (or `bind`). The refusal text, or None."""
    if not ident.rbac:
        return None
    if kind == "RoleBinding":
        ref = obj.get("roleRef") or {}
        if authorize(store, ident, "bind", "roles" if ref.get("kind") == "Role" else "clusterroles", GROUP, ns,
                     ref.get("name")):
            return None
        role = (store.get(ROLES, ns, ref.get("name", "")) if ref.get("kind") == "Role"
                else store.get(CLUSTERROLES, None, ref.get("name", "")))
        rules = (role or {}).get("rules") or []
    else:
        if authorize(store, ident, "escalate", "roles", GROUP, ns):
            return None
        rules = obj.get("rules") or []
    missing = []
    for rule in rules:
        for g in rule.get("apiGroups") or [""]:
            for r in rule.get("resources") or []:
                for v in rule.get("verbs") or []:
                    if not authorize(store, ident, v, r, g, ns):
                        missing.append(f"{{APIGroups:[{g!r}], Resources:[{r!r}], Verbs:[{v!r}]}}".replace("'", '"'))
    if not missing:
        return None
    return (f'user "{ident.user}" (groups={ident.groups}) is attempting to grant RBAC permissions not currently '
            "held:\n" + "\n".join(missing))
