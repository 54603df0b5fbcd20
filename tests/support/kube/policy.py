"""Switch the emulator's cluster policies (tests/support/kube/emulator/policy.py) from a test."""
from __future__ import annotations

from typing import Any


def set_policy(kube: Any, **body: Any) -> None:
    """e.g. set_policy(kube, websocketCreateCheck=True), scc=True, pullSeconds={image: s},
    nodeGroups=[{"name", "cpu", "memoryMi", "gpus", "labels", "maxNodes", "delay"}]."""
    kube._call("PUT", "/emulator/v1/policy", body)
