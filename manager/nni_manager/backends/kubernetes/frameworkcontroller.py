"""platform: frameworkcontroller — one Framework per environment (microsoft/frameworkcontroller).

Each task's pod runs an agent behind FrameworkController's barrier, whose injector script
exports the peers' addresses (FB_<ROLE>_IPS, FB_<ROLE>_ADDRESSES) before the agent starts,
so trials inherit them. The trial ends by each role's frameworkAttemptCompletionPolicy.
With NNI v1's `configPath`, each Framework is built from that template (framework_template.py).
"""
from __future__ import annotations

import copy
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import yaml

from nni_manager.backends.base import Completion, EnvironmentRequest, Role, Shape
from nni_manager.backends.jobs import StateTable
from nni_manager.backends.kubernetes import access, framework_template
from nni_manager.backends.kubernetes.client import KubeError, api_error
from nni_manager.backends.kubernetes.common import KubeBackend, labels, selector
from nni_manager.backends.kubernetes.podspec import merge_pod_spec
from nni_manager.backends.kubernetes.config import FrameworkConfig, parse_frameworkcontroller
from nni_manager.config import ConfigSection, ExperimentConfig

BARRIER_IMAGE = "frameworkcontroller/frameworkbarrier"
BARRIER_DIR = "/mnt/frameworkbarrier"
BARRIER_RESOURCES = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}
BARRIER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"}}
STOP_REQUESTED = -210  # CompletionCodeStopFrameworkRequested: executionType Stop
BASE_PORT = 4000  # NNI gave role i containerPort 4000 + i
RBAC = "rbac.authorization.k8s.io"
# The barrier GETs its Framework (and the controller's own tooling lists/watches them).
BARRIER_RULES = [{"apiGroups": ["frameworkcontroller.microsoft.com"], "resources": ["frameworks"],
                  "verbs": ["get", "list", "watch"]}]
MANUAL_ACCOUNT = "nni-frameworkbarrier"  # the name the refusal suggests (one per namespace, not per experiment)

log = logging.getLogger(__name__)


def barrier_objects(name: str, namespace: str, accounts: list[str], with_account: bool,
                    meta_labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """ServiceAccount (when `with_account`), Role and RoleBinding letting `accounts` read Frameworks."""
    def meta(n: str) -> dict[str, Any]:
        return {"name": n, "namespace": namespace, **({"labels": dict(meta_labels)} if meta_labels else {})}
    out: list[dict[str, Any]] = []
    if with_account:
        out.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(name)})
    out.append({"apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": meta(name), "rules": BARRIER_RULES})
    out.append({"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding", "metadata": meta(name),
                "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": a, "namespace": namespace} for a in accounts]})
    return out


class FrameworkControllerBackend(KubeBackend[FrameworkConfig]):
    platform = "frameworkcontroller"
    trial_command_required = False
    custom = ("frameworkcontroller.microsoft.com", "v1", "frameworks", "Framework")
    operator_name = "FrameworkController"
    # FrameworkState (pkg/apis/frameworkcontroller/v1/types.go); a completed attempt by its completion type
    states = StateTable.of(
        waiting=["", "AttemptCreationPending", "AttemptCreationRequested", "AttemptPreparing"],
        running=["AttemptRunning", "AttemptDeletionPending", "AttemptDeletionRequested", "AttemptDeleting"],
        succeeded=["Succeeded"], failed=["Failed"], stopped=["StopFrameworkRequested"])

    options_type = FrameworkConfig

    @classmethod
    def parse_options(cls, section: ConfigSection, config: ExperimentConfig) -> FrameworkConfig:
        return parse_frameworkcontroller(section, config)

    def shape(self) -> Shape:
        roles = tuple(Role(r.name, r.replicas, r.command) for r in self.kube.roles)
        return Shape(roles, Completion(min_failed={r.name: r.min_failed for r in self.kube.roles},
                                       min_succeeded={r.name: r.min_succeeded for r in self.kube.roles}))

    def state_of(self, obj: dict[str, Any]) -> str:
        """status.state; once completed, how (the completion type). A stop someone asked for
        (`executionType: Stop`) shows from the moment the controller decided it: its attempt's
        completion status is set before its pods are deleted (AttemptDeletionPending ...)."""
        status = obj.get("status") or {}
        state = str(status.get("state") or "")
        completion = (status.get("attemptStatus") or {}).get("completionStatus") or {}
        if completion.get("code") == STOP_REQUESTED:
            return "StopFrameworkRequested"
        if state in ("AttemptCompleted", "Completed"):
            return str((completion.get("type") or {}).get("name") or state)
        return state

    def pod_names(self, object_name: str) -> list[tuple[str, str, int]]:
        return [(f"{object_name}-{r.name}-{i}", r.name, i) for r in self.kube.roles for i in range(r.replicas)]

    # ------------------------------------------------------------------ the barrier's service account
    # The frameworkbarrier reads its Framework as the pod's service account; on an RBAC cluster the
    # `default` account may not (nni#4146, frameworkcontroller#64). So the experiment grants read
    # access to the account its pods run as: one it creates (unless the config or template names
    # one), through a Role + RoleBinding labelled as the experiment's and deleted with it.
    _account: str | None = None  # the account our pods run as when none is named
    _granted = False  # whether this experiment made the Role and RoleBinding (and deletes them)

    def _named_accounts(self) -> list[str]:
        """Accounts the config (`serviceAccountName`) or the v1 template's pods name."""
        names = [self.kube.service_account_name] if self.kube.service_account_name else []
        template = self.kube.framework_template
        for raw in (template or {}).get("spec", {}).get("taskRoles", []):
            named = ((raw.get("task") or {}).get("pod") or {}).get("spec", {}).get("serviceAccountName")
            if named and named not in names and not self.kube.service_account_name:
                names.append(named)
        return names

    def _barrier_name(self) -> str:
        return f"nni-fb-{self.experiment_id.lower()}"

    async def _prepare(self) -> None:
        from kubernetes.aio import client

        ns, named = self.namespace, self._named_accounts()
        core = client.CoreV1Api(self._api)
        for account in named:  # a pod naming a missing account is refused (ServiceAccount admission)
            try:
                await core.read_namespaced_service_account(account, ns)
            except Exception as e:
                if getattr(e, "status", None) == 403:  # may not look: the pods' creation will tell
                    continue
                if getattr(e, "status", None) != 404:
                    raise api_error(e, f"reading service account {account}") from None
                raise KubeError(f"service account {account!r} (serviceAccountName) does not exist in namespace {ns}: "
                                f"create it (`kubectl create serviceaccount {account} -n {ns}`) or remove "
                                "serviceAccountName to let the experiment make one") from None
        name = self._barrier_name()
        needs = [access.Need(v, r, g) for r, g in (("roles", RBAC), ("rolebindings", RBAC))
                 for v in ("create", "deletecollection")]
        if not named:
            needs += [access.Need(v, "serviceaccounts") for v in ("create", "deletecollection")]
        denied = await access.missing(self._api, ns, needs)
        if denied:
            if named:
                log.info("using service account(s) %s for the frameworkbarrier; it must be allowed to get "
                         "frameworks in namespace %s", ", ".join(named), ns)
                return
            objects = barrier_objects(MANUAL_ACCOUNT, ns, [MANUAL_ACCOUNT], True)
            lines = "; ".join(n.line(ns) for n in denied)
            raise KubeError(
                "FrameworkController's barrier reads the Framework as the pod's service account, which needs read "
                f"access to frameworks, and the experiment may not grant it ({lines}). Apply these objects "
                f"(`kubectl apply -f -`) and set `trainingService.serviceAccountName: {MANUAL_ACCOUNT}`:\n"
                + yaml.safe_dump_all(objects, sort_keys=False))
        rbac = client.RbacAuthorizationV1Api(self._api)
        ours = labels(self.experiment_id)
        creators: dict[str, Callable[..., Awaitable[object]]] = {
            "ServiceAccount": core.create_namespaced_service_account,
            "Role": rbac.create_namespaced_role, "RoleBinding": rbac.create_namespaced_role_binding}
        for obj in barrier_objects(name, ns, named or [name], not named, ours):
            create = creators[obj["kind"]]
            try:
                await create(ns, await self._owned(obj))
            except Exception as e:
                if getattr(e, "status", None) != 409:  # a restarted manager: already there
                    raise api_error(e, f"creating {obj['kind']} {name} for the frameworkbarrier") from None
        self._granted = True
        if not named:
            self._account = name

    async def _cleanup_extra(self) -> None:
        from kubernetes.aio import client

        if not self._granted:  # the account was the user's, and so is its access
            return
        ours, ns = selector(labels(self.experiment_id)), self.namespace
        rbac = client.RbacAuthorizationV1Api(self._api)
        await rbac.delete_collection_namespaced_role_binding(ns, label_selector=ours)
        await rbac.delete_collection_namespaced_role(ns, label_selector=ours)
        if not self._named_accounts():
            await client.CoreV1Api(self._api).delete_collection_namespaced_service_account(ns, label_selector=ours)

    def extra_objects(self) -> list[dict[str, Any]]:
        named = self._named_accounts()
        return barrier_objects(self._barrier_name(), self.namespace, named or [self._barrier_name()], not named,
                               labels(self.experiment_id))

    def main_object(self, env: EnvironmentRequest, name: str, meta: dict[str, Any]) -> dict[str, Any]:
        template = self.kube.framework_template
        own = [framework_template.port(template, i) if template else None for i in range(len(self.kube.roles))]
        numbers = [n or BASE_PORT + i for i, n in enumerate(own)]  # a template's own port, else NNI's 4000 + i
        ports = " ".join(f"FB_{r.name.upper()}_PORT={n}" for r, n in zip(self.kube.roles, numbers))
        prefix = f"{ports} . {BARRIER_DIR}/injector.sh"
        task_roles = []
        for i, role in enumerate(self.kube.roles):
            if template is None:
                pod = self.pod_template(role, env, meta, container="framework", command_prefix=prefix)
            else:
                raw = template["spec"]["taskRoles"][i]
                ours = self.pod_template(role, env, meta, container=framework_template.container_name(template, i),
                                         command_prefix=prefix)
                pod = framework_template.merge_pod(raw["task"]["pod"], ours, merge_pod_spec)
                pod["spec"] = merge_pod_spec(pod["spec"], copy.deepcopy(self.kube.pod_spec))  # podSpec wins
            _with_barrier(pod["spec"], numbers[i])
            if not pod["spec"].get("serviceAccountName"):  # ours, allowed to read the Framework
                pod["spec"]["serviceAccountName"] = self._account or self._barrier_name()
            task = {"retryPolicy": {"fancyRetryPolicy": False, "maxRetryCount": 0},
                    "podGracefulDeletionTimeoutSec": int(self.config.trial_grace_period) + 15, "pod": pod}
            task_roles.append({
                "name": role.name,
                "taskNumber": role.replicas,
                "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": role.min_failed,
                                                     "minSucceededTaskCount": role.min_succeeded},
                "task": task,
            })
        spec: dict[str, Any] = {"executionType": "Start", "retryPolicy": {"fancyRetryPolicy": False, "maxRetryCount": 0},
                                "taskRoles": task_roles}
        if template is not None:
            metadata = template.get("metadata") or {}
            meta = {**meta, "labels": {**(metadata.get("labels") or {}), **meta["labels"]}}
            if metadata.get("annotations"):
                meta["annotations"] = dict(metadata["annotations"])
        return {"apiVersion": "frameworkcontroller.microsoft.com/v1", "kind": "Framework", "metadata": meta,
                "spec": spec}


def _with_barrier(spec: dict[str, Any], port: int) -> None:
    """FrameworkController's barrier (an init container writing the peers' addresses, sourced
    before the agent starts), unless the pod (a template's) already has it; the role's port."""
    container = spec["containers"][0]
    container.setdefault("ports", [{"containerPort": port}])
    if not any(m.get("mountPath") == BARRIER_DIR for m in container.setdefault("volumeMounts", [])):
        container["volumeMounts"].append({"name": "frameworkbarrier-volume", "mountPath": BARRIER_DIR})
    inits = spec.setdefault("initContainers", [])
    if not any(str(c.get("image", "")).startswith(BARRIER_IMAGE) for c in inits):
        inits.append({"name": "frameworkbarrier", "image": BARRIER_IMAGE,
                      "volumeMounts": [{"name": "frameworkbarrier-volume", "mountPath": BARRIER_DIR}],
                      # a namespace with a compute ResourceQuota refuses a container that states none;
                      # Pod Security "restricted" and OpenShift's restricted-v2 want no privilege
                      "resources": dict(BARRIER_RESOURCES), "securityContext": dict(BARRIER_SECURITY)})
    if not any(v.get("name") == "frameworkbarrier-volume" for v in spec["volumes"]):
        spec["volumes"].append({"name": "frameworkbarrier-volume", "emptyDir": {}})
