"""The training operator's validating webhooks (kubeflow/training-operator v1.8 `pkg/webhooks`),
which the API server calls after schema validation: a denial is the webhook's Invalid status,
prefixed as the API server prefixes it."""
from __future__ import annotations

import re

from .api import ApiError, FieldError, Resource, invalid

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_WEBHOOKS = {"PyTorchJob": "validator.pytorchjob.training-operator.kubeflow.org",
             "TFJob": "validator.tfjob.training-operator.kubeflow.org"}
_SPECS = {"PyTorchJob": ("pytorchReplicaSpecs", ("Master", "Worker"), "pytorch"),
          "TFJob": ("tfReplicaSpecs", ("Chief", "Master", "PS", "Worker", "Evaluator"), "tensorflow")}


def check(res: Resource, obj: dict, old: dict | None) -> None:
    """Raise the webhook's denial for `obj` (create or update) of a kubeflow.org job."""
    if res.group != "kubeflow.org" or res.kind not in _SPECS:
        return
    key, types, container = _SPECS[res.kind]
    name = (obj.get("metadata") or {}).get("name", "")
    errs: list[FieldError] = []
    if old is None and not DNS1035.match(name):
        errs.append(FieldError("metadata.name", "FieldValueInvalid", f'Invalid value: "{name}": a DNS-1035 label '
                               "must consist of lower case alphanumeric characters or '-', start with an alphabetic "
                               "character, and end with an alphanumeric character"))
    for rtype, spec in sorted(((obj.get("spec") or {}).get(key) or {}).items()):
        path = f"spec.{key}[{rtype}]"
        if res.kind == "PyTorchJob" and rtype not in types:
            errs.append(FieldError(path, "FieldValueNotSupported", f'Unsupported value: "{rtype}": supported values: '
                                   + ", ".join(f'"{t}"' for t in types)))
        containers = (((spec or {}).get("template") or {}).get("spec") or {}).get("containers") or []
        if not containers:
            errs.append(FieldError(f"{path}.template.spec.containers", "FieldValueRequired", "Required value: must be specified"))
        elif not any(c.get("name") == container for c in containers):
            errs.append(FieldError(f"{path}.template.spec.containers", "FieldValueRequired",
                                   f"Required value: There is no container named {container} in {rtype}"))
        replicas = (spec or {}).get("replicas")
        if res.kind == "PyTorchJob" and rtype == "Master" and replicas is not None and replicas != 1:
            errs.append(FieldError(f"{path}.replicas", "FieldValueForbidden", "Forbidden: must be 1"))
    chiefs = [t for t in ((obj.get("spec") or {}).get(key) or {}) if t in ("Chief", "Master")]
    if res.kind == "TFJob" and len(chiefs) > 1:
        errs.append(FieldError(f"spec.{key}", "FieldValueForbidden", "Forbidden: must not have more than 1 Chief or Master role"))
    if errs:
        denial = invalid(res, name, errs)
        raise ApiError(denial.code, denial.reason, f'admission webhook "{_WEBHOOKS[res.kind]}" denied the request: '
                       + denial.message, denial.details)
