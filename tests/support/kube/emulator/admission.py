"""Pod admission a cluster's operator turns on, as the real plug-ins answer:

- Pod Security admission (kubernetes/pod-security-admission) from the namespace's label
  `pod-security.kubernetes.io/enforce` (`baseline` or `restricted`): a pod that violates the level
  is refused with 403 `violates PodSecurity "restricted:latest": <check> (<detail>), ...`.
- OpenShift's SecurityContextConstraints admission, `restricted-v2` (policy `scc`): the namespace's
  annotations `openshift.io/sa.scc.uid-range` and `openshift.io/sa.scc.supplemental-groups` (`start/size`)
  give the ranges; a runAsUser or fsGroup outside them is refused (403 `unable to validate against
  any security context constraint`), missing ones are set (runAsUser: the range's first UID, on each
  container; fsGroup: the groups' first), with allowPrivilegeEscalation false, capabilities drop ALL,
  seccomp RuntimeDefault, and the annotation `openshift.io/scc: restricted-v2`.
- ResourceQuota on compute resources: with a quota on cpu / memory every container, init
  containers included, must say that resource (403 `failed quota: q: must specify ...`).
"""
from __future__ import annotations

from typing import Any

from .api import ApiError

ENFORCE = "pod-security.kubernetes.io/enforce"
UID_RANGE = "openshift.io/sa.scc.uid-range"
GROUP_RANGE = "openshift.io/sa.scc.supplemental-groups"
_RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}
_BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                  "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def _names(cs: list[dict[str, Any]]) -> str:
    return ", ".join(f'"{c.get("name")}"' for c in cs)


def _which(cs: list[dict[str, Any]]) -> str:
    return ("container " if len(cs) == 1 else "containers ") + _names(cs)


def pod_security(level: str, pod: dict[str, Any]) -> list[str]:
    """The checks of `level` (baseline, restricted) the pod fails, in the admission's words."""
    spec = pod.get("spec") or {}
    psc = spec.get("securityContext") or {}
    cs = _containers(spec)
    out: list[str] = []
    privileged = [c for c in cs if (c.get("securityContext") or {}).get("privileged")]
    if privileged:
        out.append(f"privileged ({_which(privileged)} must not set securityContext.privileged=true)")
    if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
        out.append("host namespaces (hostNetwork=true)")
    host_path = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    if host_path:
        out.append(f'hostPath volumes (volume {", ".join(repr(v) for v in host_path)})')
    caps_added = [c for c in cs if set(((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or [])
                  - _BASELINE_CAPS]
    if caps_added:
        out.append(f"non-default capabilities ({_which(caps_added)} must not include capabilities beyond the default set)")
    if level != "restricted":
        return out
    bad_vols = [v["name"] for v in spec.get("volumes") or [] if not (set(v) - {"name"}) <= _RESTRICTED_VOLUMES]
    if bad_vols:
        out.append(f"restricted volume types (volume {', '.join(repr(v) for v in bad_vols)} uses a restricted volume type)")
    escalation = [c for c in cs if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False]
    if escalation:
        out.append(f"allowPrivilegeEscalation != false ({_which(escalation)} must set "
                   "securityContext.allowPrivilegeEscalation=false)")
    no_drop = [c for c in cs if "ALL" not in (((c.get("securityContext") or {}).get("capabilities") or {}).get("drop") or [])]
    if no_drop:
        out.append(f'unrestricted capabilities ({_which(no_drop)} must set securityContext.capabilities.drop=["ALL"])')

    def own(c: dict[str, Any], key: str) -> Any:
        v = (c.get("securityContext") or {}).get(key)
        return psc.get(key) if v is None else v
    non_root = [c for c in cs if own(c, "runAsNonRoot") is not True]
    if non_root:
        out.append(f"runAsNonRoot != true (pod or {_which(non_root)} must set securityContext.runAsNonRoot=true)")
    root = [c for c in cs if own(c, "runAsUser") == 0]
    if root:
        out.append(f"runAsUser=0 (pod or {_which(root)} must not set runAsUser=0)")
    seccomp = [c for c in cs if ((own(c, "seccompProfile") or {}).get("type")) not in ("RuntimeDefault", "Localhost")]
    if seccomp:
        out.append(f'seccompProfile (pod or {_which(seccomp)} must set securityContext.seccompProfile.type to '
                   '"RuntimeDefault" or "Localhost")')
    return out


def _range(text: str) -> tuple[int, int]:
    start, _, size = text.partition("/")
    return int(start), int(start) + int(size or 1) - 1


def scc_restricted_v2(ns: dict[str, Any], pod: dict[str, Any]) -> None:
    """Validate against and default from restricted-v2 (raises the 403); mutates `pod`."""
    ann = (ns.get("metadata") or {}).get("annotations") or {}
    if UID_RANGE not in ann:
        return
    uids = _range(ann[UID_RANGE])
    groups = _range(ann.get(GROUP_RANGE) or ann[UID_RANGE])
    spec, name = pod["spec"], pod["metadata"]["name"]
    psc = spec.setdefault("securityContext", {})
    errors: list[str] = []
    if psc.get("runAsUser") is not None and not uids[0] <= psc["runAsUser"] <= uids[1]:
        errors.append(f"spec.securityContext.runAsUser: Invalid value: {psc['runAsUser']}: must be in the ranges: "
                      f"[{uids[0]}, {uids[1]}]")
    if psc.get("fsGroup") is not None and not groups[0] <= psc["fsGroup"] <= groups[1]:
        errors.append(f"spec.securityContext.fsGroup: Invalid value: []int64{{{psc['fsGroup']}}}: "
                      f"{psc['fsGroup']} is not an allowed group")
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or []):
            sc = c.get("securityContext") or {}
            if sc.get("runAsUser") is not None and not uids[0] <= sc["runAsUser"] <= uids[1]:
                errors.append(f"spec.{kind}[{i}].securityContext.runAsUser: Invalid value: {sc['runAsUser']}: "
                              f"must be in the ranges: [{uids[0]}, {uids[1]}]")
            if sc.get("privileged") or sc.get("allowPrivilegeEscalation") is True:
                errors.append(f"spec.{kind}[{i}].securityContext.allowPrivilegeEscalation: Invalid value: true: "
                              "Allowing privilege escalation for containers is not allowed")
    if errors:
        raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: unable to validate against any security '
                       'context constraint: [provider "anyuid": Forbidden: not usable by user or serviceaccount, '
                       f'provider restricted-v2: {", ".join(errors)}]', {"name": name, "kind": "pods"})
    psc.setdefault("fsGroup", groups[0])
    for c in _containers(spec):
        sc = c.setdefault("securityContext", {})
        if sc.get("runAsUser") is None and psc.get("runAsUser") is None:
            sc["runAsUser"] = uids[0]
        sc.setdefault("runAsNonRoot", True)
        sc.setdefault("allowPrivilegeEscalation", False)
        sc.setdefault("capabilities", {}).setdefault("drop", ["ALL"])
    psc.setdefault("seccompProfile", {"type": "RuntimeDefault"})
    pod["metadata"].setdefault("annotations", {})["openshift.io/scc"] = "restricted-v2"


def quota_must_specify(quota: dict[str, Any], pod: dict[str, Any]) -> None:
    """A quota on compute resources needs every container to say them (kubernetes' quota evaluator)."""
    hard = (quota.get("spec") or {}).get("hard") or {}
    missing: list[str] = []
    for key in sorted(hard):
        kind, _, res = key.partition(".") if key.startswith(("requests.", "limits.")) else ("requests", "", key)
        if res not in ("cpu", "memory"):
            continue
        lacking = [c.get("name") for c in _containers(pod["spec"])
                   if res not in (((c.get("resources") or {}).get(kind) or {}))
                   and not (kind == "requests" and res in ((c.get("resources") or {}).get("limits") or {}))]
        if lacking:
            missing.append(f"{kind}.{res} for: {','.join(lacking)}")
    if missing:
        name = pod["metadata"]["name"]
        raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: failed quota: {quota["metadata"]["name"]}: '
                       f"must specify {'; '.join(missing)}", {"name": name, "kind": "pods"})


def admit(store: Any, ns: dict[str, Any] | None, pod: dict[str, Any], quotas: list[dict[str, Any]]) -> None:
    """SCC (mutating, then validating), Pod Security, quota: raises the first refusal."""
    if ns is not None and store.policy.scc:
        scc_restricted_v2(ns, pod)
    level = (((ns or {}).get("metadata") or {}).get("labels") or {}).get(ENFORCE, "privileged")
    if level in ("baseline", "restricted"):
        violations = pod_security(level, pod)
        if violations:
            name = pod["metadata"]["name"]
            raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: violates PodSecurity "{level}:latest": '
                           + ", ".join(violations), {"name": name, "kind": "pods"})
    for quota in quotas:
        quota_must_specify(quota, pod)
