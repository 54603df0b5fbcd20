"""Artificial GPU reports, as an agent's telemetry carries them, for placement and constraint tests."""
from __future__ import annotations

from nni_agent.v1 import agent_pb2 as pb


def gpus(n: int, active: tuple[int, ...] = (), pid: int = 999) -> pb.GpuReport:
    report = pb.GpuReport(provider="artificial")
    for i in range(n):
        g = report.gpus.add(index=i, active=i in active)
        if i in active:
            g.processes.add(pid=pid, type="compute")
    return report
