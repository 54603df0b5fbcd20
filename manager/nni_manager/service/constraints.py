"""NNI's `placementConstraint` of a trial, read and checked once (placement uses the result).

NNI (ts/nni_manager/common/trainingService.ts, reusable/gpuScheduler.ts):
- `{type: None}` (or none given): trialGpuNumber GPUs anywhere;
- `{type: GPUNumber, gpus: [n]}`: n GPUs anywhere; exactly one number;
- `{type: Device, gpus: [[host, index], ...]}`: exactly those GPUs of that one host.

A constraint that can never be met as written (GPUs on two hosts, a malformed entry) is an
error for the trial, with the reason, rather than a trial that waits forever.
"""
from __future__ import annotations

from dataclasses import dataclass
TYPES = ("None", "GPUNumber", "Device")


@dataclass(frozen=True)
class Constraint:
    gpu_number: int | None  # GPUs anywhere (None: no GPU scheduling)
    device: tuple[str, tuple[int, ...]] | None = None  # Device: (host, GPU indices on it)
    invalid: str = ""  # why it can never be met as written


def _index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse(pc: object, default_gpus: int | None) -> Constraint:
    """The trial's constraint; `default_gpus` is trialGpuNumber."""
    if not pc:
        return Constraint(default_gpus)
    if not isinstance(pc, dict):
        return Constraint(None, invalid=f"placementConstraint must be a mapping with `type` and `gpus`, got {pc!r}")
    kind = pc.get("type", "None")
    gpus = pc.get("gpus")
    if kind == "None":
        return Constraint(default_gpus)
    if kind == "GPUNumber":
        if not isinstance(gpus, (list, tuple)) or len(gpus) != 1 or not _index(gpus[0]):
            return Constraint(None, invalid="placementConstraint GPUNumber must give exactly one number of GPUs "
                                            f"(e.g. gpus: [2]), got gpus: {gpus!r}")
        return Constraint(int(gpus[0]))
    if kind == "Device":
        if not isinstance(gpus, (list, tuple)) or not gpus:
            return Constraint(None, invalid="placementConstraint Device lists no GPU: give gpus: [[host, index], ...]")
        pairs = []
        for entry in gpus:
            if (not isinstance(entry, (list, tuple)) or len(entry) != 2 or not isinstance(entry[0], str)
                    or not entry[0] or not _index(entry[1])):
                return Constraint(None, invalid=f"placementConstraint Device entry {entry!r} is not [host, GPU index]")
            pairs.append((entry[0], int(entry[1])))
        hosts = list(dict.fromkeys(h for h, _ in pairs))
        if len(hosts) > 1:
            return Constraint(None, invalid=f"placementConstraint Device lists GPUs of several hosts "
                                            f"({', '.join(hosts)}); a trial runs on one machine: list GPUs of one host")
        indices = tuple(sorted(dict.fromkeys(i for _, i in pairs)))
        return Constraint(len(indices), device=(hosts[0], indices))
    return Constraint(None, invalid=f"placementConstraint type {kind!r} is not one of {', '.join(TYPES)}")
