"""Custom resources of the emulator: CRD registry and structural-schema validation.

The schemas are the published ``openAPIV3Schema``s in ``shared/schemas`` (never copied into the
project).  A custom object goes through what the real kube-apiserver does with a CR whose CRD has a
structural schema:

1. decoding: fields the schema does not know are *pruned* (``fieldValidation=Warn``, the default:
   with a warning ``unknown field "spec.foo"``; ``Ignore``: silently) or rejected
   (``Strict``: 400 ``strict decoding error: unknown field "spec.foo"``); ``metadata`` keeps only
   ObjectMeta's fields; ``x-kubernetes-preserve-unknown-fields`` stops pruning below it;
2. defaulting from the schema's ``default`` values;
3. ObjectMeta validation (name is a DNS-1123 subdomain, label syntax);
4. schema validation (``jsonschema`` on the schema translated from the Kubernetes dialect:
   ``nullable``, ``x-kubernetes-int-or-string``, ``format``), errors worded as the apiserver words
   them (``spec.x: Invalid value: "string": spec.x in body must be of type integer: "string"``).

Served versions are those of the current operators: ``kubeflow.org/v1`` (tfjobs, pytorchjobs),
``adaptdl.petuum.com/v1`` (adaptdljobs: adaptdl.py), ``frameworkcontroller.microsoft.com/v1`` (frameworks) and
``trainer.kubeflow.org/v1alpha1`` (Kubeflow Trainer v2: trainjobs, clustertrainingruntimes; trainer.py); older kubeflow versions (v1alpha2,
v1beta1, v1beta2) are not registered, so the server answers 404 for them.
"""
from __future__ import annotations

import copy
import datetime
import json
import re
from typing import Any, Iterable

import jsonschema

from tests.support.schemas import SCHEMAS_ENV, schemas_dir  # noqa: F401 (re-exported: tests use crds.*)

from .api import FieldError, Resource, bad_request

KUBEFLOW_GROUP = "kubeflow.org"
FRAMEWORK_GROUP = "frameworkcontroller.microsoft.com"
TRAINER_GROUP = "trainer.kubeflow.org"  # Kubeflow Trainer v2 (trainer.py)

TFJOBS = Resource(KUBEFLOW_GROUP, "v1", "tfjobs", "TFJob")
PYTORCHJOBS = Resource(KUBEFLOW_GROUP, "v1", "pytorchjobs", "PyTorchJob")
FRAMEWORKS = Resource(FRAMEWORK_GROUP, "v1", "frameworks", "Framework")

from .adaptdl import ADAPTDL_GROUP, ADAPTDLJOBS, SCHEMA_FILE as ADAPTDL_SCHEMA_FILE  # noqa: E402

SCHEMA_FILES = {
    ADAPTDLJOBS: ADAPTDL_SCHEMA_FILE,
    TFJOBS: "kubeflow/tfjob-v1.schema.json",
    PYTORCHJOBS: "kubeflow/pytorchjob-v1.schema.json",
    FRAMEWORKS: "frameworkcontroller/framework-v1.schema.json",
}
GROUP_RESOURCES = {
    KUBEFLOW_GROUP: [TFJOBS, PYTORCHJOBS],
    FRAMEWORK_GROUP: [FRAMEWORKS],
    ADAPTDL_GROUP: [ADAPTDLJOBS],
}
# Versions the pre-v1 operators served; not served any more (404), listed for documentation/tests.
UNSERVED_VERSIONS = {KUBEFLOW_GROUP: ["v1alpha1", "v1alpha2", "v1beta1", "v1beta2"]}


OBJECT_META_FIELDS = {
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels",
    "annotations", "ownerReferences", "finalizers", "managedFields",
}


# ----------------------------------------------------------------------------- schema location

def load_schema(res: Resource) -> dict:
    return json.loads((schemas_dir() / SCHEMA_FILES[res]).read_text())


# ----------------------------------------------------------------------------- formatting

def go_value(v: Any) -> str:
    """A value as apimachinery's field.Error prints it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if isinstance(v, float) else str(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    return json.dumps(v, separators=(",", ":"), sort_keys=True)


def json_type(v: Any) -> str:
    """The type name go-openapi reports for a decoded JSON value."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def path_str(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    return out


# ----------------------------------------------------------------------------- ObjectMeta

DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN_RE = re.compile(rf"^{DNS1123_LABEL}(\.{DNS1123_LABEL})*$")
DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
QUALIFIED_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
QUALIFIED_NAME_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
    "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")


def _invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError(field, "FieldValueInvalid", f"Invalid value: {go_value(value)}: {detail}")


def validate_dns1123_subdomain(field: str, name: str) -> list[FieldError]:
    errs = []
    if len(name) > 253:
        errs.append(_invalid(field, name, "must be no more than 253 characters"))
    if not DNS1123_SUBDOMAIN_RE.match(name):
        errs.append(_invalid(field, name, DNS1123_SUBDOMAIN_MSG))
    return errs


def validate_label_key(field: str, key: str) -> list[FieldError]:
    errs = []
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append(_invalid(field, key, "prefix part must be non-empty"))
        else:
            if len(prefix) > 253:
                errs.append(_invalid(field, key, "prefix part must be no more than 253 characters"))
            if not DNS1123_SUBDOMAIN_RE.match(prefix):
                errs.append(_invalid(field, key, "prefix part " + DNS1123_SUBDOMAIN_MSG))
    else:
        return [_invalid(field, key, "a qualified name " + QUALIFIED_NAME_MSG.replace("name part ", "")
                         + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')")]
    if not name:
        errs.append(_invalid(field, key, "name part must be non-empty"))
    else:
        if len(name) > 63:
            errs.append(_invalid(field, key, "name part must be no more than 63 characters"))
        if not QUALIFIED_NAME_RE.match(name):
            errs.append(_invalid(field, key, QUALIFIED_NAME_MSG))
    return errs


def validate_labels(labels: Any, field: str = "metadata.labels") -> list[FieldError]:
    errs: list[FieldError] = []
    if not isinstance(labels, dict):
        return errs
    for k, v in labels.items():
        errs += validate_label_key(field, k)
        if not isinstance(v, str):
            continue
        if len(v) > 63:
            errs.append(_invalid(field, v, "must be no more than 63 characters"))
        if not LABEL_VALUE_RE.match(v):
            errs.append(_invalid(field, v, LABEL_VALUE_MSG))
    return errs


def validate_object_meta(obj: dict) -> list[FieldError]:
    md = obj.get("metadata") or {}
    errs: list[FieldError] = []
    name = md.get("name")
    if not name and not md.get("generateName"):
        errs.append(FieldError("metadata.name", "FieldValueRequired",
                               "Required value: name or generateName is required"))
    elif name:
        errs += validate_dns1123_subdomain("metadata.name", name)
    errs += validate_labels(md.get("labels"))
    return errs


# ----------------------------------------------------------------------------- pruning/defaulting

def _prune(value: Any, schema: dict, path: list, unknown: list[str], drop: bool) -> None:
    """Structural pruning (and defaulting) of ``value`` in place; unknown paths go to ``unknown``."""
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema \
            and "additionalProperties" not in schema:
        return
    if isinstance(value, dict):
        props = schema.get("properties")
        addl = schema.get("additionalProperties")
        if props is not None or (addl is None and not schema.get("x-kubernetes-preserve-unknown-fields")
                                 and schema.get("type") == "object"):
            props = props or {}
            for k in list(value):
                if not path and k in ("apiVersion", "kind"):
                    continue
                if not path and k == "metadata":
                    md = value[k]
                    if isinstance(md, dict):
                        for mk in list(md):
                            if mk not in OBJECT_META_FIELDS:
                                unknown.append(path_str(["metadata", mk]))
                                if drop:
                                    del md[mk]
                    continue
                if k in props:
                    _prune(value[k], props[k], path + [k], unknown, drop)
                elif schema.get("x-kubernetes-preserve-unknown-fields"):
                    continue
                else:
                    unknown.append(path_str(path + [k]))
                    if drop:
                        del value[k]
            for k, sub in props.items():
                if k not in value and "default" in sub:
                    value[k] = copy.deepcopy(sub["default"])
        elif isinstance(addl, dict):
            for k in value:
                _prune(value[k], addl, path + [k], unknown, drop)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _prune(item, schema["items"], path + [i], unknown, drop)


# ----------------------------------------------------------------------------- schema translation

_DROP_KEYS = {"description", "default", "example", "externalDocs"}


def translate(schema: Any, root: bool = True) -> Any:
    """Kubernetes structural schema -> JSON Schema (draft 4) for ``jsonschema``."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k in _DROP_KEYS or k.startswith("x-kubernetes-") or k in ("nullable", "$comment"):
            continue
        if k == "properties":
            out[k] = {pk: translate(pv, False) for pk, pv in v.items()}
        elif k in ("items", "additionalProperties", "not"):
            out[k] = translate(v, False)
        elif k in ("anyOf", "allOf", "oneOf"):
            out[k] = [translate(x, False) for x in v]
        else:
            out[k] = v
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("anyOf", None)
        out["type"] = ["integer", "string"]
    if schema.get("nullable") and "type" in out:
        t = out["type"]
        out["type"] = (list(t) if isinstance(t, list) else [t]) + ["null"]
    if root and isinstance(out.get("properties", {}).get("metadata"), dict):
        # ObjectMeta is validated by validate_object_meta; the schema may only restrict the name.
        md = out["properties"]["metadata"]
        out["properties"]["metadata"] = {"type": "object",
                                         "properties": {k: v for k, v in md.get("properties", {}).items()
                                                        if k in ("name", "generateName")}}
    return out


_FORMAT_CHECKER = jsonschema.FormatChecker(formats=())


@_FORMAT_CHECKER.checks("date-time", raises=ValueError)
def _check_date_time(v: Any) -> bool:
    if not isinstance(v, str):
        return True
    if not re.match(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$", v):
        raise ValueError(v)
    datetime.datetime.fromisoformat(v.replace("z", "Z").replace("Z", "+00:00"))
    return True


@_FORMAT_CHECKER.checks("int-or-string")
def _check_ios(v: Any) -> bool:
    return True


def _to_field_error(err: jsonschema.ValidationError) -> FieldError:
    parts = list(err.absolute_path)
    kw = err.validator
    inst = err.instance
    path = path_str(parts)
    if kw == "required":
        m = re.match(r"'(.*)' is a required property", err.message)
        missing = m.group(1) if m else str(err.validator_value)
        return FieldError(path_str(parts + [missing]), "FieldValueRequired", "Required value")
    if kw == "type":
        expected = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
        expected = [t for t in expected if t != "null"]
        actual = json_type(inst)
        return FieldError(path, "FieldValueTypeInvalid",
                          f'Invalid value: "{actual}": {path} in body must be of type '
                          f'{",".join(expected)}: "{actual}"')
    if kw == "enum":
        vals = ", ".join(json.dumps(x) if isinstance(x, str) else json.dumps(x) for x in err.validator_value)
        return FieldError(path, "FieldValueNotSupported",
                          f"Unsupported value: {go_value(inst)}: supported values: {vals}")
    if kw == "minimum":
        return _invalid(path, inst, f"{path} in body should be greater than or equal to {err.validator_value}")
    if kw == "maximum":
        return _invalid(path, inst, f"{path} in body should be less than or equal to {err.validator_value}")
    if kw == "pattern":
        return _invalid(path, inst, f"{path} in body should match '{err.validator_value}'")
    if kw == "format":
        return _invalid(path, inst, f'{path} in body must be of type {err.validator_value}: {go_value(inst)}')
    if kw == "maxLength":
        return FieldError(path, "FieldValueTooLong", f"Too long: may not be longer than {err.validator_value}")
    if kw == "minLength":
        return _invalid(path, inst, f"{path} in body should be at least {err.validator_value} chars long")
    if kw == "maxItems":
        return FieldError(path, "FieldValueTooMany",
                          f"Too many: {len(inst)}: must have at most {err.validator_value} items")
    if kw == "minItems":
        return _invalid(path, inst, f"{path} in body should have at least {err.validator_value} items")
    return _invalid(path, inst if not isinstance(inst, (dict, list)) else "", f"{path} in body {err.message}")


class CustomResourceSchema:
    """One served version of a CRD with its structural schema."""

    def __init__(self, res: Resource, schema: dict):
        self.res = res
        self.schema = schema
        self.json_schema = translate(schema)
        self._validator = jsonschema.Draft4Validator(self.json_schema, format_checker=_FORMAT_CHECKER)
        self.warnings: list[str] = []

    def __call__(self, obj: dict, field_validation: str = "Warn") -> list[FieldError]:
        return self.validate(obj, field_validation)

    def validate(self, obj: dict, field_validation: str = "Warn") -> list[FieldError]:
        """Prune/default ``obj`` in place and return its field errors (empty: valid).

        Raises ApiError 400 for unknown fields under ``Strict``. Warnings (Warn mode) are left in
        ``self.warnings`` (and in ``crds.last_warnings()``) for the server's ``Warning`` headers."""
        fv = field_validation or "Warn"
        unknown: list[str] = []
        _prune(obj, self.schema, [], unknown, drop=(fv != "Strict"))
        self.warnings = [f'unknown field "{p}"' for p in unknown] if fv == "Warn" else []
        _LAST_WARNINGS[:] = self.warnings
        if fv == "Strict" and unknown:
            raise bad_request("strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in unknown))
        errs = validate_object_meta(obj)
        errs += sorted((_to_field_error(e) for e in self._validator.iter_errors(obj)),
                       key=lambda e: e.field)
        return errs


_LAST_WARNINGS: list[str] = []


def last_warnings() -> list[str]:
    """Warnings (``unknown field "..."``) of the most recent validation (all on one loop)."""
    return list(_LAST_WARNINGS)


_SCHEMA_CACHE: dict[Resource, CustomResourceSchema] = {}


def schema_for(res: Resource) -> CustomResourceSchema:
    if res not in _SCHEMA_CACHE:
        _SCHEMA_CACHE[res] = CustomResourceSchema(res, load_schema(res))
    return _SCHEMA_CACHE[res]


def validator_for(res: Resource) -> CustomResourceSchema:
    """A fresh validator (own ``warnings``) sharing the cached schema."""
    base = schema_for(res)
    v = CustomResourceSchema.__new__(CustomResourceSchema)
    v.res, v.schema, v.json_schema, v._validator, v.warnings = (
        res, base.schema, base.json_schema, base._validator, [])
    return v


def install(cluster, groups: set[str] | Iterable[str]) -> list[Resource]:
    """Register the custom resources of the installed API ``groups`` and start their controllers."""
    groups = set(groups)
    installed: list[Resource] = []
    for group in sorted(groups):
        for res in GROUP_RESOURCES.get(group, []):
            cluster.register_custom_resource(res, validator_for(res))
            installed.append(res)
    if KUBEFLOW_GROUP in groups:
        from . import operators
        cluster.register_controller(operators.start_tfjob_controller)
        cluster.register_controller(operators.start_pytorchjob_controller)
    if FRAMEWORK_GROUP in groups:
        from . import framework
        cluster.register_controller(framework.start_framework_controller)
    if TRAINER_GROUP in groups:  # Kubeflow Trainer v2: its CRDs are fixtures of ours (trainer.py)
        from . import trainer
        installed += trainer.install(cluster)
    if ADAPTDL_GROUP in groups:
        from . import adaptdl
        adaptdl.install_claims(cluster)
        cluster.register_controller(adaptdl.start_adaptdl_controller)
    return installed
