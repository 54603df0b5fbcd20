"""`podSpec` overrides, merged into the pods the Kubernetes platforms build."""
from __future__ import annotations

from typing import Any


def merge_pod_spec(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`podSpec` overrides: mappings merge, lists of named items merge by name, others replace."""
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = merge_pod_spec(base[key], value)
        elif isinstance(value, list) and isinstance(base.get(key), list) and all(
                isinstance(v, dict) and "name" in v for v in value + base[key]):
            by_name = {v["name"]: v for v in base[key]}
            for v in value:
                by_name[v["name"]] = merge_pod_spec(by_name.get(v["name"], {}), v)
            base[key] = list(by_name.values())
        else:
            base[key] = value
    return base
