"""Selectors, patches, quantities, timestamps: the API server's small helpers."""
from __future__ import annotations

import copy
import datetime as _dt
import re
from typing import Any, Callable

from .api import ApiError, bad_request


def now_rfc3339() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_rfc3339_micro() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------- label selectors
_LABEL_TOKEN = re.compile(r"\s*(!=|==|=|\(|\)|,|!|[^\s!=(),]+)")


def parse_label_selector(text: str) -> Callable[[dict], bool]:
    """Parse a label selector as labels.Parse does; returns a predicate over a labels dict."""
    text = (text or "").strip()
    if not text:
        return lambda labels: True
    toks = [t for t in _LABEL_TOKEN.findall(text)]
    reqs: list[Callable[[dict], bool]] = []
    i = 0

    def err(msg: str) -> ApiError:
        return bad_request(f"unable to parse requirement: {msg}")

    def expect_values() -> list[str]:
        nonlocal i
        if i >= len(toks) or toks[i] != "(":
            raise err(f"found '{toks[i] if i < len(toks) else ''}', expected: '('")
        i += 1
        vals = []
        while i < len(toks) and toks[i] != ")":
            if toks[i] != ",":
                vals.append(toks[i])
            i += 1
        if i >= len(toks):
            raise err("found '', expected: ')'")
        i += 1
        return vals

    while i < len(toks):
        t = toks[i]
        if t == "!":
            i += 1
            key = toks[i] if i < len(toks) else ""
            i += 1
            reqs.append(lambda labels, k=key: k not in labels)
        else:
            key = t
            i += 1
            op = toks[i] if i < len(toks) else ","
            if op == ",":
                reqs.append(lambda labels, k=key: k in labels)
            elif op in ("=", "==", "!="):
                i += 1
                val = toks[i] if i < len(toks) and toks[i] != "," else ""
                if val:
                    i += 1
                if op == "!=":
                    reqs.append(lambda labels, k=key, v=val: labels.get(k) != v)
                else:
                    reqs.append(lambda labels, k=key, v=val: labels.get(k) == v)
            elif op in ("in", "notin"):
                i += 1
                vals = set(expect_values())
                if op == "in":
                    reqs.append(lambda labels, k=key, vs=vals: k in labels and labels[k] in vs)
                else:
                    reqs.append(lambda labels, k=key, vs=vals: labels.get(k) not in vs)
            else:
                raise err(f"found '{op}', expected: in, notin, =, ==, !=, gt, lt")
        if i < len(toks):
            if toks[i] != ",":
                raise err(f"found '{toks[i]}', expected: ','")
            i += 1
    return lambda labels: all(r(labels or {}) for r in reqs)


# ---------------------------------------------------------------- field selectors
_FIELDS = {
    "pods": {"metadata.name", "metadata.namespace", "status.phase", "spec.nodeName",
             "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName", "status.podIP",
             "status.nominatedNodeName", "spec.hostNetwork"},
    "events": {"metadata.name", "metadata.namespace", "involvedObject.kind", "involvedObject.namespace",
               "involvedObject.name", "involvedObject.uid", "involvedObject.apiVersion",
               "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason", "reportingComponent",
               "source", "type"},
    "secrets": {"metadata.name", "metadata.namespace", "type"},
    "nodes": {"metadata.name", "spec.unschedulable"},
    "namespaces": {"metadata.name", "status.phase"},
}


def _get_path(obj: dict, path: str) -> str:
    if path == "source" and "involvedObject" in obj:  # an Event's `source` selects source.component
        path = "source.component"
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def parse_field_selector(text: str, plural: str, kind: str, api_version: str = "v1") -> Callable[[dict], bool]:
    text = (text or "").strip()
    if not text:
        return lambda obj: True
    allowed = _FIELDS.get(plural, {"metadata.name", "metadata.namespace"})
    reqs = []
    for part in text.split(","):
        part = part.strip()
        m = re.match(r"^([^=!]+)(==|!=|=)(.*)$", part)
        if not m:
            raise bad_request(f'invalid selector: \'{text}\'; can\'t understand \'{part}\'')
        f, op, v = m.group(1).strip(), m.group(2), m.group(3).strip()
        if f not in allowed:
            raise bad_request(f'field label not supported: {f}')
        if op == "!=":
            reqs.append(lambda o, f=f, v=v: _get_path(o, f) != v)
        else:
            reqs.append(lambda o, f=f, v=v: _get_path(o, f) == v)
    return lambda obj: all(r(obj) for r in reqs)


# ---------------------------------------------------------------- patches
def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = json_merge_patch(result.get(k), v)
    return result


# lists merged by key in strategic merge patch (field name -> merge key)
_SMP_KEYS = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name",
             "volumes": "name", "env": "name", "volumeMounts": "mountPath", "ports": "containerPort",
             "imagePullSecrets": "name", "tolerations": None, "conditions": "type",
             "ownerReferences": "uid", "finalizers": None, "hostAliases": "ip",
             "containerStatuses": "name", "initContainerStatuses": "name"}


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$"):
            continue
        if v is None:
            result.pop(k, None)
            continue
        key = _SMP_KEYS.get(k)
        if isinstance(v, list) and key and isinstance(result.get(k), list):
            cur = [copy.deepcopy(x) for x in result[k]]
            for item in v:
                if not isinstance(item, dict) or key not in item:
                    cur.append(copy.deepcopy(item))
                    continue
                if item.get("$patch") == "delete":
                    cur = [x for x in cur if not (isinstance(x, dict) and x.get(key) == item[key])]
                    continue
                for idx, x in enumerate(cur):
                    if isinstance(x, dict) and x.get(key) == item[key]:
                        cur[idx] = strategic_merge_patch(x, item)
                        break
                else:
                    cur.append({kk: vv for kk, vv in item.items() if not kk.startswith("$")})
            result[k] = cur
        elif isinstance(v, dict) and v.get("$patch") == "replace":
            result[k] = {kk: vv for kk, vv in v.items() if kk != "$patch"}
        else:
            result[k] = strategic_merge_patch(result.get(k), v)
    return result


def _ptr(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer: {path}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: Any, ops: list) -> Any:
    """RFC 6902."""
    doc = copy.deepcopy(doc)
    if not isinstance(ops, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")

    def walk(parts):
        cur = doc
        for p in parts[:-1]:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        return cur, parts[-1]

    def get(parts):
        cur = doc
        for p in parts:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        return cur

    def add(parts, value):
        nonlocal doc
        if not parts:
            doc = value
            return
        parent, last = walk(parts)
        if isinstance(parent, list):
            parent.insert(len(parent) if last == "-" else int(last), value)
        else:
            parent[last] = value

    def remove(parts):
        parent, last = walk(parts)
        if isinstance(parent, list):
            return parent.pop(int(last))
        return parent.pop(last)

    for op in ops:
        try:
            kind = op["op"]
            parts = _ptr(op["path"])
            if kind == "add":
                add(parts, copy.deepcopy(op["value"]))
            elif kind == "remove":
                remove(parts)
            elif kind == "replace":
                remove(parts)
                add(parts, copy.deepcopy(op["value"]))
            elif kind == "move":
                v = remove(_ptr(op["from"]))
                add(parts, v)
            elif kind == "copy":
                add(parts, copy.deepcopy(get(_ptr(op["from"]))))
            elif kind == "test":
                if get(parts) != op["value"]:
                    raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request")
            else:
                raise bad_request(f"Unexpected kind: {kind}")
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(422, "Invalid",
                           "the server rejected our request due to an error in our request") from None
    return doc


# ---------------------------------------------------------------- quantities
_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "P": 1e15, "E": 1e18}
QUANTITY_RE = re.compile(r"^([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?)$")


def parse_quantity(q: Any) -> float:
    """Quantity -> float (cores for cpu, bytes for memory). ValueError if malformed."""
    if isinstance(q, bool):
        raise ValueError(q)
    if isinstance(q, (int, float)):
        return float(q)
    m = QUANTITY_RE.match(str(q).strip())
    if not m or m.group(1) in ("", ".", "+", "-"):
        raise ValueError(q)
    num = float(m.group(1))
    if m.group(2):
        return num * 10 ** int(m.group(2)[1:])
    return num * _SUFFIX[m.group(3) or ""]
