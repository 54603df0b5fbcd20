"""Job protocol v2 as the rest-server handles it on submit (pai@v1.8 middlewares/v2/protocol.js):
YAML -> ajv schema check -> prerequisite/deployment checks -> server-side command rendering.

Errors carry PAI's codes and messages so a client sees what the real server answers."""
from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

import jsonschema
import yaml

from tests.support.schemas import SCHEMAS_ENV, schemas_dir  # noqa: F401 (re-exported)

SCHEMA_FILE = "openpai/rest-server-protocol.schema.json"
PREREQUISITE_TYPES = ("script", "output", "data", "dockerimage")
PREREQUISITE_FIELDS = ("script", "output", "data", "dockerImage")


class PaiError(Exception):
    """An error the rest-server's express error handler turns into ``{"code", "message"}``.
    ``code=None`` is a non-HTTP error (js-yaml, mustache): 500 with only ``message``."""

    def __init__(self, status: int, code: str | None, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def body(self) -> dict:
        return {"message": self.message} if self.code is None else {"code": self.code, "message": self.message}


@lru_cache(maxsize=1)
def validator() -> jsonschema.Draft7Validator:
    schema = json.loads((schemas_dir() / SCHEMA_FILE).read_text())
    return jsonschema.Draft7Validator(schema)


# ----------------------------------------------------------------------------- ajv-6 style errors
_IDENT = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")


def _data_path(path) -> str:
    """ajv 6 (jsonPointers: false) dataPath: ``.taskRoles.worker``, ``.prerequisites[0]``, ``['a-b']``."""
    out = ""
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
        elif _IDENT.match(p):
            out += f".{p}"
        else:
            out += "['" + p.replace("\\", "\\\\").replace("'", "\\'") + "']"
    return out


def _type_name(t) -> str:
    return ",".join(t) if isinstance(t, list) else t


def _ajv(err: jsonschema.ValidationError) -> list[dict]:
    """One jsonschema error as the ajv 6 error object(s) the real server reports (allErrors: true)."""
    kw, sp = err.validator, "#/" + "/".join(str(p) for p in err.absolute_schema_path)
    path = list(err.absolute_path)
    dp = _data_path(path)
    v = err.validator_value
    if kw == "oneOf":
        subs = [e for c in (err.context or []) for e in _ajv(c)]
        return subs + [{"keyword": "oneOf", "dataPath": dp, "schemaPath": sp, "params": {"passingSchemas": None},
                        "message": "should match exactly one schema in oneOf"}]
    if kw == "additionalProperties":
        allowed = set(err.schema.get("properties", {}))
        pats = [re.compile(p) for p in err.schema.get("patternProperties", {})]
        extras = [k for k in err.instance if k not in allowed and not any(p.search(k) for p in pats)]
        return [{"keyword": kw, "dataPath": dp, "schemaPath": sp, "params": {"additionalProperty": k},
                 "message": "should NOT have additional properties"} for k in extras]
    if kw == "required":
        missing = [k for k in v if isinstance(err.instance, dict) and k not in err.instance]
        return [{"keyword": kw, "dataPath": dp, "schemaPath": sp, "params": {"missingProperty": "." + k},
                 "message": f"should have required property '.{k}'"} for k in missing]
    simple = {
        "type": ({"type": _type_name(v)}, f"should be {_type_name(v)}"),
        "enum": ({"allowedValues": v}, "should be equal to one of the allowed values"),
        "pattern": ({"pattern": v}, f'should match pattern "{v}"'),
        "maxLength": ({"limit": v}, f"should NOT be longer than {v} characters"),
        "minimum": ({"comparison": ">=", "limit": v, "exclusive": False}, f"should be >= {v}"),
        "minItems": ({"limit": v}, f"should NOT have fewer than {v} items"),
        "minProperties": ({"limit": v}, f"should NOT have fewer than {v} properties"),
    }
    params, msg = simple.get(kw, ({}, err.message))
    return [{"keyword": kw, "dataPath": dp, "schemaPath": sp, "params": params, "message": msg}]


def schema_errors(obj: Any) -> list[dict]:
    errs = sorted(validator().iter_errors(obj), key=lambda e: (list(map(str, e.absolute_path)),))
    return [a for e in errs for a in _ajv(e)]


# ----------------------------------------------------------------------------- js-yaml / JS semantics
def js_load(text: str) -> Any:
    """yaml.safeLoad; a YAML syntax error is a plain Error in the real server (500, no code)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PaiError(500, None, str(e).replace("\n", " ")) from None


def js_str(v: Any) -> str:
    """JavaScript String(v), used where mustache.js output is concatenated."""
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, list):
        return ",".join("" if x is None else js_str(x) for x in v)
    if isinstance(v, dict):
        return "[object Object]"
    return str(v)


def _lookup(ctx: dict, name: str) -> Any:
    cur: Any = ctx
    for part in name.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return None
    return cur


_TAG = re.compile(r"<%(.*?)%>", re.S)


def render_server(template: str, ctx: dict) -> str:
    """protocol.js ``render``: ``<% name %>`` resolved from ctx, unresolved names re-emitted as
    ``<% name %>`` (so ``$secrets`` survive to the runtime), other tag kinds dropped, result trimmed."""
    out, pos = [], 0
    for m in _TAG.finditer(template):
        out.append(template[pos:m.start()])
        pos = m.end()
        inner = m.group(1).strip()
        if inner[:1] in ("#", "^", "/", "!", "&", "=", ">", "{"):
            continue                      # not a 'name' token: render() ignores it
        name = re.sub(r"\[(\d+)\]", r".\1", inner)
        val = _lookup(ctx, name)
        out.append(js_str(val) if val is not None else f"<% {name} %>")
    rest = template[pos:]
    if "<%" in rest:
        raise PaiError(500, None, f"Unclosed tag at {len(template)}")
    out.append(rest)
    return "".join(out).strip()


# ----------------------------------------------------------------------------- validate + render
def validate(text: str) -> dict:
    """protocolValidate: schema, then duplicate prerequisites/deployments and dangling references."""
    obj = js_load(text)
    errs = schema_errors(obj)
    if errs:
        raise PaiError(400, "InvalidProtocolError", json.dumps(errs, separators=(",", ":")))
    prereqs: dict[str, dict] = {t: {} for t in PREREQUISITE_TYPES}
    names = set()
    for item in obj.get("prerequisites") or []:
        if item["name"] in prereqs[item["type"]]:
            raise PaiError(400, "InvalidProtocolError", f"Duplicate {item['type']} prerequisites {item['name']}.")
        prereqs[item["type"]][item["name"]] = item
        names.add(item["name"])
    obj["prerequisites"] = prereqs
    deployments: dict[str, dict] = {}
    for item in obj.get("deployments") or []:
        if item["name"] in deployments:
            raise PaiError(400, "InvalidProtocolError", f"Duplicate deployments {item['name']}.")
        deployments[item["name"]] = item
    obj["deployments"] = deployments
    for role in obj["taskRoles"].values():
        for p in role.get("prerequisites") or []:
            if p not in names:
                raise PaiError(400, "InvalidProtocolError", f"Prerequisite {p} does not exist.")
    for role in obj["taskRoles"].values():
        for field in PREREQUISITE_FIELDS:
            if field in role and role[field] not in prereqs[field.lower()]:
                raise PaiError(400, "InvalidProtocolError", f"Prerequisite {role[field]} does not exist.")
    dflt = obj.get("defaults") or {}
    if "deployment" in dflt and dflt["deployment"] not in deployments:
        raise PaiError(400, "InvalidProtocolError", f"Default deployment {dflt['deployment']} does not exist.")
    return obj


def render(obj: dict) -> dict:
    """protocolRender: wrap deployment pre/post commands, join with newlines, render everything but
    ``$secrets`` into each task role's ``entrypoint`` (secrets are rendered in the runtime)."""
    deployment = None
    dflt = obj.get("defaults") or {}
    if "deployment" in dflt:
        deployment = obj["deployments"][dflt["deployment"]]
    pre = obj["prerequisites"]
    for name, role in obj["taskRoles"].items():
        commands = list(role["commands"])
        if deployment is not None and name in deployment["taskRoles"]:
            d = deployment["taskRoles"][name]
            commands = list(d.get("preCommands") or []) + commands + list(d.get("postCommands") or [])
        joined = "\n".join(str(c).strip() for c in commands)
        ctx = {"$parameters": obj.get("parameters"), "$script": pre["script"].get(role.get("script")),
               "$output": pre["output"].get(role.get("output")), "$data": pre["data"].get(role.get("data"))}
        role["entrypoint"] = render_server(joined, ctx)
    return obj


def mask(raw: str) -> str:
    """protocolSecret.mask: the stored job config shows ``secrets: "******"``."""
    s = raw + "\nZ"
    s = re.sub(r"(^secrets:)[\s\S]*?(^\w)", r'\1 "******"\n\2', s, count=1, flags=re.M)
    return s[:-2]


# ----------------------------------------------------------------------------- runtime-side secrets
def _convert(obj: Any) -> Any:
    """openpai-runtime common/utils.py _convert_to_dict: lists become {"0": ...} for ``data[0]``."""
    if isinstance(obj, list):
        return {str(i): v for i, v in enumerate(obj)}
    if isinstance(obj, dict):
        return {k: _convert(v) for k, v in obj.items()}
    return obj


def _py_str(v: Any) -> str:
    return str(v)


def _html_escape(s: str) -> str:
    return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("'", "&#x27;"))


def render_secrets(command: str, secrets: Any) -> str:
    """render_string_with_secrets (pystache, ``<% %>`` delimiters): ``<% $secrets.x %>`` and
    ``<% $secrets.x[0] %>`` become values (HTML-escaped, as pystache escapes by default; ``<%& %>``
    does not), any other unresolved tag becomes the empty string. No secrets: command unchanged."""
    if not secrets:
        return command
    ctx = {"$secrets": _convert(secrets)}

    def sub(m: re.Match) -> str:
        inner = m.group(1).strip()
        raw = inner[:1] == "&"
        if inner[:1] in ("#", "^", "/", "!", "=", ">"):
            return ""
        if raw or inner[:1] == "{":
            inner = inner.strip("&{} ")
        val = _lookup(ctx, re.sub(r"\[(\d+)\]", r".\1", inner))
        if val is None:
            return ""
        return _py_str(val) if raw else _html_escape(_py_str(val))
    return _TAG.sub(sub, command)
