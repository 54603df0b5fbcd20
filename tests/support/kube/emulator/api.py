"""Interface between the emulator's store (API server) and plug-ins (CRDs, operators).

All methods of :class:`Cluster` must be called on the emulator's single asyncio loop.
Objects are plain JSON dicts as the API server stores them; ``get``/``list`` return deep copies,
so callers may mutate them freely.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol


@dataclass(frozen=True)
class Resource:
    group: str          # '' for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return self.kind + "List"


@dataclass
class FieldError:
    field: str          # e.g. 'spec.tfReplicaSpecs.Worker.replicas'
    reason: str         # 'FieldValueRequired' | 'FieldValueInvalid' | 'FieldValueNotSupported' | 'FieldValueTooLong' | 'FieldValueDuplicate' | 'FieldValueTypeInvalid'
    message: str        # the full cause message, e.g. 'Invalid value: "x": must be ...' or 'Required value'


class ApiError(Exception):
    """Raised by store operations; the server turns it into a ``Status`` body."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> dict:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                "status": "Failure", "message": self.message,
                                "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


def _details(res: Resource, name: str | None) -> dict:
    d: dict[str, Any] = {}
    if name:
        d["name"] = name
    if res.group:
        d["group"] = res.group
    d["kind"] = res.plural
    return d


def not_found(res: Resource, name: str) -> ApiError:
    gr = f"{res.plural}.{res.group}" if res.group else res.plural
    return ApiError(404, "NotFound", f'{gr} "{name}" not found', _details(res, name))


def already_exists(res: Resource, name: str) -> ApiError:
    gr = f"{res.plural}.{res.group}" if res.group else res.plural
    return ApiError(409, "AlreadyExists", f'{gr} "{name}" already exists', _details(res, name))


def conflict(res: Resource, name: str) -> ApiError:
    gr = f"{res.plural}.{res.group}" if res.group else res.plural
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {gr} "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again", _details(res, name))


def invalid(res: Resource, name: str, errors: list[FieldError]) -> ApiError:
    """422 Invalid, message as the apiserver writes it: `Kind "name" is invalid: [field: msg, ...]`."""
    gk = f"{res.kind}.{res.group}" if res.group else res.kind
    parts = [f"{e.field}: {e.message}" for e in errors]
    msg = f'{gk} "{name}" is invalid: ' + (parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]")
    details = {"name": name, **({"group": res.group} if res.group else {}), "kind": res.kind,
               "causes": [{"reason": e.reason, "message": e.message, "field": e.field} for e in errors]}
    return ApiError(422, "Invalid", msg, details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


Validator = Callable[[dict, str], "list[FieldError]"]
WatchCallback = Callable[[str, Resource, dict], None]


class Cluster(Protocol):
    """What plug-ins (crds.install, operators) may call. Implemented by ``store.Store``."""

    instance_id: str            # marker value of KUBE_EMULATOR_INSTANCE for this emulator

    def get(self, res: Resource, ns: str | None, name: str) -> dict | None: ...

    def list(self, res: Resource, ns: str | None = None, label_selector: str = "") -> list[dict]: ...

    def create(self, res: Resource, obj: dict) -> dict:
        """Validate, default and store ``obj`` (namespace from obj.metadata.namespace, 'default' if
        absent for namespaced resources). Assigns uid/resourceVersion/creationTimestamp/generation.
        Raises ApiError (409 AlreadyExists, 422 Invalid, 404 namespace not found)."""
        ...

    def replace(self, res: Resource, obj: dict, *, subresource: str = "") -> dict:
        """PUT semantics. With a status subresource: subresource='' keeps the stored .status,
        subresource='status' changes only .status. metadata.resourceVersion, if set, must match (409)."""
        ...

    def update_status(self, res: Resource, ns: str, name: str, status: dict) -> dict:
        """Replace .status wholesale (no resourceVersion check). Emits MODIFIED if changed."""
        ...

    def patch_metadata(self, res: Resource, ns: str, name: str, *, labels: dict | None = None,
                       annotations: dict | None = None, finalizers: list | None = None) -> dict:
        """Merge labels/annotations (value None removes a key); replace finalizers if given."""
        ...

    def delete(self, res: Resource, ns: str, name: str, grace_seconds: float | None = None,
               propagation: str = "Background") -> None:
        """Pods: graceful via the kubelet (deletionTimestamp, SIGTERM, grace, SIGKILL, then removed).
        Others: removed at once. Dependents (ownerReferences.uid) are garbage-collected unless
        propagation == 'Orphan'. Raises ApiError 404 if absent."""
        ...

    def subscribe(self, callback: WatchCallback) -> None:
        """callback(type, res, obj) after every change; type 'ADDED'|'MODIFIED'|'DELETED'.
        Called synchronously on the loop; do not block (schedule tasks instead)."""
        ...

    def record_event(self, involved: dict, reason: str, message: str, type_: str = "Normal") -> None:
        """Create a core/v1 Event about ``involved`` (a stored object) as a controller would."""
        ...

    def register_custom_resource(self, res: Resource, validate: Validator) -> None:
        """Serve /apis/{group}/{version}/namespaces/{ns}/{plural} with a status subresource.
        validate(obj, field_validation) -> list of FieldError (empty = valid); field_validation is
        'Strict'|'Warn'|'Ignore'. It may raise ApiError itself (e.g. 400 strict decoding error) and
        may drop unknown fields in place (Warn/Ignore)."""
        ...

    def register_controller(self, start: Callable[["Cluster"], Awaitable[None]]) -> None:
        """start(cluster) is run as a task on the loop for the emulator's life (cancelled at exit)."""
        ...


# Well-known core resources.
PODS = Resource("", "v1", "pods", "Pod")
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
SECRETS = Resource("", "v1", "secrets", "Secret")
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
SERVICES = Resource("", "v1", "services", "Service")
EVENTS = Resource("", "v1", "events", "Event")
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount")
RESOURCEQUOTAS = Resource("", "v1", "resourcequotas", "ResourceQuota")
CORE_RESOURCES = [PODS, NAMESPACES, NODES, SECRETS, CONFIGMAPS, SERVICES, EVENTS, SERVICEACCOUNTS, RESOURCEQUOTAS]
