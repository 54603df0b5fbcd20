"""Validation of core objects as the API server does it.

1. Decoding: the published OpenAPI schemas (kubernetes-validate, strict variant, k8s 1.33) find
   unknown fields (fieldValidation Strict -> 400 "strict decoding error", Warn -> dropped with a
   Warning header, Ignore -> dropped) and type errors (400 "cannot be handled as a Pod").
2. Semantic validation the schema lacks (names, labels, quantities, volume references, ...):
   422 Invalid with causes.
"""
from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from typing import Any

from .api import ApiError, FieldError, Resource, bad_request
from .util import QUANTITY_RE, parse_quantity

SCHEMA_VERSION = "v1.33.0-local-strict"

DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN = DNS1123_LABEL + r"(\." + DNS1123_LABEL + r")*"
DNS1035_LABEL = r"[a-z]([-a-z0-9]*[a-z0-9])?"
QUALIFIED_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
LABEL_VALUE = r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
CONFIG_KEY = r"[-._a-zA-Z0-9]+"
ENV_NAME = r"[-._a-zA-Z][-._a-zA-Z0-9]*"

MSG_SUBDOMAIN = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                 "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                 "validation is '" + DNS1123_SUBDOMAIN + "')")
MSG_LABEL = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
             "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
             "validation is '" + DNS1123_LABEL + "')")
MSG_1035 = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
            "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
            "regex used for validation is '" + DNS1035_LABEL + "')")
MSG_QNAME = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
             "an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
             "validation is '" + QUALIFIED_NAME + "')")
MSG_LVALUE = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
              "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
              "'12345', regex used for validation is '" + LABEL_VALUE + "')")
MSG_CKEY = ("a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  "
            "or 'KEY_NAME',  or 'key-name', regex used for validation is '" + CONFIG_KEY + "')")
MSG_ENV = ("a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or "
           "'.', and must not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', "
           "regex used for validation is '" + ENV_NAME + "')")
MSG_QUANTITY = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
MAX_DATA = 1024 * 1024

_SCHEMA_FILES = {"Pod": "pod-v1", "Secret": "secret-v1", "ConfigMap": "configmap-v1", "Service": "service-v1",
                 "Namespace": "namespace-v1", "Event": "event-v1", "ServiceAccount": "serviceaccount-v1",
                 "Node": "node-v1", "ResourceQuota": "resourcequota-v1", "Role": "role-rbac-v1",
                 "RoleBinding": "rolebinding-rbac-v1", "ClusterRole": "clusterrole-rbac-v1",
                 "ClusterRoleBinding": "clusterrolebinding-rbac-v1"}


def _q(v: Any) -> str:
    return json.dumps(v) if isinstance(v, str) else json.dumps(v)


def inv(field: str, value: Any, msg: str) -> FieldError:
    return FieldError(field, "FieldValueInvalid", f"Invalid value: {_q(value)}: {msg}")


def required(field: str) -> FieldError:
    return FieldError(field, "FieldValueRequired", "Required value")


@functools.lru_cache(maxsize=None)
def _validator(kind: str):
    import jsonschema
    import referencing
    from importlib import resources
    base = resources.files("kubernetes_validate").joinpath("kubernetes-json-schema", SCHEMA_VERSION)
    schema = json.loads(base.joinpath(_SCHEMA_FILES[kind] + ".json").read_text())
    defs = json.loads(base.joinpath("_definitions.json").read_text())
    registry = referencing.Registry().with_resources([
        (schema["$id"], referencing.Resource.from_contents(schema)),
        (defs["$id"], referencing.Resource.from_contents(defs))])
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (("." if out else "") + str(p))
    return out


def decode(res: Resource, obj: dict, field_validation: str) -> list[str]:
    """Schema check. Returns the warnings (unknown fields dropped); raises 400 on errors."""
    if res.kind not in _SCHEMA_FILES:
        return []
    if not isinstance(obj, dict):
        raise bad_request(f'{res.kind} in version "v1" cannot be handled as a {res.kind}: '
                          "json: cannot unmarshal into Go value of type struct")
    unknown: list[tuple[list, str]] = []
    type_errors: list[str] = []
    for e in _validator(res.kind).iter_errors(obj):
        _collect(e, unknown, type_errors)
    if type_errors:
        raise bad_request(f'{res.kind} in version "v1" cannot be handled as a {res.kind}: {type_errors[0]}')
    if not unknown:
        return []
    names = sorted({_path(list(p) + [k]) for p, k in unknown})
    if field_validation == "Strict":
        raise bad_request("strict decoding error: " + ", ".join(f'unknown field "{n}"' for n in names))
    for p, k in unknown:                    # drop them, as the decoder does
        cur: Any = obj
        for part in p:
            cur = cur[part]
        cur.pop(k, None)
    return [] if field_validation == "Ignore" else [f'unknown field "{n}"' for n in names]


def _collect(e, unknown, type_errors):
    if e.validator == "additionalProperties":
        props = set((e.schema.get("properties") or {}).keys())
        for k in e.instance:
            if k not in props:
                unknown.append((list(e.absolute_path), k))
    elif e.validator in ("oneOf", "anyOf") and e.context:
        # Quantity / IntOrString: report as a decode error
        type_errors.append(f"json: cannot unmarshal {_jtype(e.instance)} into Go struct field "
                           f"{_path(e.absolute_path)} of type {'resource.Quantity' if 'number' in str(e.schema) else 'intstr'}")
    elif e.validator == "required":
        pass                                # semantic validation reports these (422)
    elif e.validator == "enum" and list(e.absolute_path) in (["kind"], ["apiVersion"]):
        pass
    else:
        type_errors.append(f"json: cannot unmarshal {_jtype(e.instance)} into Go struct field "
                           f"{_path(e.absolute_path)} of type {e.schema.get('type', 'object')}")


def _jtype(v: Any) -> str:
    return {str: "string", bool: "bool", int: "number", float: "number", list: "array",
            dict: "object"}.get(type(v), "null")


# ---------------------------------------------------------------- semantic
def check_name(name: Any, field: str, rule: str = "subdomain") -> list[FieldError]:
    if not isinstance(name, str) or name == "":
        return [required(field)]
    errs = []
    if rule == "label" or rule == "1035":
        if len(name) > 63:
            errs.append(inv(field, name, "must be no more than 63 characters"))
        rx, msg = (DNS1123_LABEL, MSG_LABEL) if rule == "label" else (DNS1035_LABEL, MSG_1035)
        if not re.fullmatch(rx, name):
            errs.append(inv(field, name, msg))
    else:
        if len(name) > 253:
            errs.append(inv(field, name, "must be no more than 253 characters"))
        if not re.fullmatch(DNS1123_SUBDOMAIN, name):
            errs.append(inv(field, name, MSG_SUBDOMAIN))
    return errs


def check_labels(labels: Any, field: str) -> list[FieldError]:
    errs = []
    for k, v in (labels or {}).items():
        name = k
        if "/" in k:
            prefix, name = k.split("/", 1)
            if not re.fullmatch(DNS1123_SUBDOMAIN, prefix) or len(prefix) > 253:
                errs.append(inv(field, k, "prefix part " + MSG_SUBDOMAIN))
        if not name or len(name) > 63 or not re.fullmatch(QUALIFIED_NAME, name):
            errs.append(inv(field, k, "name part must be no more than 63 characters" if len(name) > 63 else MSG_QNAME))
        if v is None or not isinstance(v, str):
            continue
        if len(v) > 63:
            errs.append(inv(field, v, "must be no more than 63 characters"))
        elif not re.fullmatch(LABEL_VALUE, v):
            errs.append(inv(field, v, MSG_LVALUE))
    return errs


def check_metadata(res: Resource, obj: dict) -> list[FieldError]:
    md = obj.get("metadata") or {}
    rule = {"Namespace": "label", "Service": "1035"}.get(res.kind, "subdomain")
    errs: list[FieldError] = []
    if not md.get("name") and not md.get("generateName"):
        errs.append(FieldError("metadata.name", "FieldValueRequired", "Required value: name or generateName is required"))
    elif md.get("name"):
        errs += check_name(md["name"], "metadata.name", rule)
    errs += check_labels(md.get("labels"), "metadata.labels")
    for k in (md.get("annotations") or {}):
        if "/" in k:
            k = k.split("/", 1)[1]
        if not re.fullmatch(QUALIFIED_NAME, k) or len(k) > 63:
            errs.append(inv("metadata.annotations", k, MSG_QNAME))
    return errs


def _bad_quantity(res: Resource) -> ApiError:
    return bad_request(f'{res.kind} in version "v1" cannot be handled as a {res.kind}: {MSG_QUANTITY}')


def validate_container(res: Resource, c: dict, f: str, volumes: set[str], init: bool) -> list[FieldError]:
    errs: list[FieldError] = []
    errs += check_name(c.get("name"), f + ".name", "label")
    if not c.get("image"):
        errs.append(required(f + ".image"))
    for i, p in enumerate(c.get("ports") or []):
        if p.get("name"):
            if len(p["name"]) > 15 or not re.fullmatch(DNS1123_LABEL, p["name"]):
                errs.append(inv(f"{f}.ports[{i}].name", p["name"], MSG_LABEL if len(p["name"]) <= 15
                                else "must be no more than 15 characters"))
        cp = p.get("containerPort")
        if not isinstance(cp, int) or not 0 < cp < 65536:
            errs.append(inv(f"{f}.ports[{i}].containerPort", cp, "must be between 1 and 65535, inclusive"))
    for i, e in enumerate(c.get("env") or []):
        if not e.get("name"):
            errs.append(required(f"{f}.env[{i}].name"))
        elif not re.fullmatch(ENV_NAME, e["name"]):
            errs.append(inv(f"{f}.env[{i}].name", e["name"], MSG_ENV))
        vf = e.get("valueFrom")
        if vf is not None:
            if e.get("value"):
                errs.append(inv(f"{f}.env[{i}].valueFrom", "", "may not be specified when `value` is not empty"))
            if len([k for k in ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef") if vf.get(k)]) != 1:
                errs.append(inv(f"{f}.env[{i}].valueFrom", "", "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`"))
            fr = vf.get("fieldRef")
            if fr:
                path = fr.get("fieldPath", "")
                ok = path in ("metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
                              "spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP",
                              "status.podIPs") or re.fullmatch(r"metadata\.(labels|annotations)\['[^']+'\]", path)
                if not ok:
                    errs.append(FieldError(f"{f}.env[{i}].valueFrom.fieldRef.fieldPath", "FieldValueNotSupported",
                                           f'Unsupported value: {_q(path)}: supported values: "metadata.name", '
                                           '"metadata.namespace", "metadata.uid", "spec.nodeName", '
                                           '"spec.serviceAccountName", "status.hostIP", "status.hostIPs", '
                                           '"status.podIP", "status.podIPs"'))
    seen_paths = set()
    for i, m in enumerate(c.get("volumeMounts") or []):
        if not m.get("name"):
            errs.append(required(f"{f}.volumeMounts[{i}].name"))
        elif m["name"] not in volumes:
            errs.append(FieldError(f"{f}.volumeMounts[{i}].name", "FieldValueNotFound", f'Not found: {_q(m["name"])}'))
        if not m.get("mountPath"):
            errs.append(required(f"{f}.volumeMounts[{i}].mountPath"))
        elif m["mountPath"] in seen_paths:
            errs.append(inv(f"{f}.volumeMounts[{i}].mountPath", m["mountPath"], "must be unique"))
        seen_paths.add(m.get("mountPath"))
    r = c.get("resources") or {}
    parsed: dict[str, dict[str, float]] = {}
    for kind in ("limits", "requests"):
        for k, v in (r.get(kind) or {}).items():
            if not isinstance(v, (str, int, float)) or not QUANTITY_RE.match(str(v)):
                raise _bad_quantity(res)
            try:
                parsed.setdefault(kind, {})[k] = parse_quantity(v)
            except ValueError:
                raise _bad_quantity(res) from None
    lim, req = parsed.get("limits", {}), parsed.get("requests", {})
    for k, v in req.items():
        if k in lim and v > lim[k]:
            errs.append(inv(f"{f}.resources.requests", r["requests"][k],
                            f"must be less than or equal to {k} limit of {r['limits'][k]}"))
        if "/" in k and not k.startswith("kubernetes.io/") and k not in lim:
            errs.append(FieldError(f"{f}.resources.limits", "FieldValueRequired",
                                   "Required value: Limit must be set for non overcommitable resources"))
        elif "/" in k and k in lim and v != lim[k]:
            errs.append(inv(f"{f}.resources.requests[{k}]", r["requests"][k],
                            "must be equal to " + k + " limit of " + str(r["limits"][k])))
    tmp = c.get("terminationMessagePolicy")
    if tmp and tmp not in ("File", "FallbackToLogsOnError"):
        errs.append(FieldError(f + ".terminationMessagePolicy", "FieldValueNotSupported",
                               f'Unsupported value: {_q(tmp)}: supported values: "File", "FallbackToLogsOnError"'))
    ipp = c.get("imagePullPolicy")
    if ipp and ipp not in ("Always", "IfNotPresent", "Never"):
        errs.append(FieldError(f + ".imagePullPolicy", "FieldValueNotSupported",
                               f'Unsupported value: {_q(ipp)}: supported values: "Always", "IfNotPresent", "Never"'))
    return errs


def validate_pod_spec(res: Resource, spec: dict, f: str = "spec") -> list[FieldError]:
    errs: list[FieldError] = []
    volumes: set[str] = set()
    for i, v in enumerate(spec.get("volumes") or []):
        errs += check_name(v.get("name"), f"{f}.volumes[{i}].name", "label")
        if v.get("name") in volumes:
            errs.append(FieldError(f"{f}.volumes[{i}].name", "FieldValueDuplicate", f'Duplicate value: {_q(v["name"])}'))
        volumes.add(v.get("name"))
        sources = [k for k in v if k != "name"]
        if not sources:
            errs.append(required(f"{f}.volumes[{i}]") if False else
                        FieldError(f"{f}.volumes[{i}]", "FieldValueRequired", "Required value: must specify a volume type"))
        elif len(sources) > 1:
            errs.append(FieldError(f"{f}.volumes[{i}].{sources[1]}", "FieldValueForbidden",
                                   "Forbidden: may not specify more than 1 volume type"))
        for k in ("configMap", "secret"):
            src = v.get(k)
            if isinstance(src, dict):
                ref = src.get("name") if k == "configMap" else src.get("secretName")
                if not ref:
                    errs.append(required(f"{f}.volumes[{i}].{k}.{'name' if k == 'configMap' else 'secretName'}"))
                dm = src.get("defaultMode")
                if dm is not None and not (0 <= dm <= 0o777):
                    errs.append(inv(f"{f}.volumes[{i}].{k}.defaultMode", dm,
                                    "must be a number between 0 and 0777 (octal), both inclusive"))
        if isinstance(v.get("hostPath"), dict) and not v["hostPath"].get("path"):
            errs.append(required(f"{f}.volumes[{i}].hostPath.path"))
    containers = spec.get("containers")
    if not containers:
        errs.append(required(f"{f}.containers"))
    names: set[str] = set()
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or []):
            errs += validate_container(res, c, f"{f}.{kind}[{i}]", volumes, kind == "initContainers")
            if c.get("name") in names:
                errs.append(FieldError(f"{f}.{kind}[{i}].name", "FieldValueDuplicate", f'Duplicate value: {_q(c["name"])}'))
            names.add(c.get("name"))
    rp = spec.get("restartPolicy")
    if rp is not None and rp not in ("Always", "OnFailure", "Never"):
        errs.append(FieldError(f"{f}.restartPolicy", "FieldValueNotSupported",
                               f'Unsupported value: {_q(rp)}: supported values: "Always", "OnFailure", "Never"'))
    g = spec.get("terminationGracePeriodSeconds")
    if g is not None and g < 0:
        errs.append(inv(f"{f}.terminationGracePeriodSeconds", g, "must be greater than or equal to 0"))
    for k, v in (spec.get("nodeSelector") or {}).items():
        errs += check_labels({k: v}, f"{f}.nodeSelector")
    if spec.get("serviceAccountName"):
        errs += check_name(spec["serviceAccountName"], f"{f}.serviceAccountName", "subdomain")
    return errs


def _data_checks(obj: dict, binary_ok: bool) -> list[FieldError]:
    errs = []
    total = 0
    for fld in ("data", "binaryData", "stringData"):
        for k, v in (obj.get(fld) or {}).items():
            if not re.fullmatch(CONFIG_KEY, k) or len(k) > 253:
                errs.append(inv(f"{fld}[{k}]", k, MSG_CKEY))
            if (fld == "binaryData" or binary_ok and fld == "data") and isinstance(v, str):  # decoded, as the API server counts
                try:
                    total += len(base64.b64decode(v))
                except (binascii.Error, ValueError):
                    total += len(v)
            elif fld == "data" and not binary_ok and isinstance(v, str):
                total += len(v.encode())
            else:
                total += len(v) if isinstance(v, (str, bytes)) else 0
    if total > MAX_DATA:
        errs.append(FieldError("data" if binary_ok else "[]", "FieldValueTooLong",
                               f"Too long: must have at most {MAX_DATA} bytes"))
    return errs


def validate(res: Resource, obj: dict) -> list[FieldError]:
    """Semantic (422) validation of a core object after decoding and defaulting."""
    errs = check_metadata(res, obj)
    if res.kind == "Pod":
        errs += validate_pod_spec(res, obj.get("spec") or {})
    elif res.kind == "Secret":
        for v in (obj.get("data") or {}).values():
            try:
                base64.b64decode(v or "", validate=True)
            except (binascii.Error, ValueError, TypeError):
                raise bad_request(f'Secret in version "v1" cannot be handled as a Secret: illegal base64 data at input byte {_bad_b64_pos(v)}') from None
        errs += _data_checks(obj, True)
    elif res.kind == "ConfigMap":
        errs += _data_checks(obj, False)
        dup = set(obj.get("data") or {}) & set(obj.get("binaryData") or {})
        for k in sorted(dup):
            errs.append(inv(f"data[{k}]", k, "duplicate of key present in binaryData"))
    elif res.kind == "Service":
        for i, p in enumerate((obj.get("spec") or {}).get("ports") or []):
            port = p.get("port")
            if not isinstance(port, int) or not 0 < port < 65536:
                errs.append(inv(f"spec.ports[{i}].port", port, "must be between 1 and 65535, inclusive"))
    return errs


def _bad_b64_pos(v: Any) -> int:
    s = str(v)
    for i, ch in enumerate(s):
        if not (ch.isalnum() or ch in "+/="):
            return i
    return max(len(s) - len(s) % 4, 0)


POD_MUTABLE = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds")


def validate_pod_update(old: dict, new: dict) -> list[FieldError]:
    """Pod spec is immutable except images, activeDeadlineSeconds, added tolerations."""
    o, n = dict(old.get("spec") or {}), dict(new.get("spec") or {})
    for s in (o, n):
        for k in POD_MUTABLE:
            s.pop(k, None)
        s["containers"] = [{k: v for k, v in c.items() if k != "image"} for c in s.get("containers") or []]
        s["initContainers"] = [{k: v for k, v in c.items() if k != "image"} for c in s.get("initContainers") or []]
    if o.get("nodeName") and not n.get("nodeName"):
        n["nodeName"] = o["nodeName"]
    if o != n:
        return [FieldError("spec", "FieldValueForbidden",
                           "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
                           "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
                           "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
                           "(allow it to be set to 1 if it was previously negative)")]
    return []


def validate_immutable_update(old: dict, new: dict) -> list[FieldError]:
    """ConfigMaps and Secrets with `immutable: true` (ValidateConfigMapUpdate / ValidateSecretUpdate):
    neither the flag nor the data may change; only deleting the object removes them."""
    if old.get("immutable") is not True:
        return []
    forbidden = "Forbidden: field is immutable when `immutable` is set"
    errs = []
    if new.get("immutable") is not True:
        errs.append(FieldError("immutable", "FieldValueForbidden", forbidden))
    for f in ("data", "binaryData") if old.get("kind") == "ConfigMap" else ("data",):
        if (new.get(f) or {}) != (old.get(f) or {}):
            errs.append(FieldError(f, "FieldValueForbidden", forbidden))
    return errs
