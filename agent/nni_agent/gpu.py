"""GPU sampling: NVML, artificial GPUs (a testing aid), or none with the reason why.

A failing GPU probe never stops the agent: it reports zero GPUs and says why, so the
manager can explain a WAITING trial instead of looping silently (NNI issues #3077, #5574).

Testing aid: NNI_AGENT_ARTIFICIAL_GPUS=N pretends there are N GPUs ("Artificial GPU i",
16 GiB each); NNI_AGENT_ARTIFICIAL_ACTIVE_GPUS=0,2 puts a fake non-NNI process on those
indices, so placement with and without useActiveGpu can be tested on any machine.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Protocol

from nni_agent.v1 import agent_pb2 as pb

ARTIFICIAL_GPUS_ENV = "NNI_AGENT_ARTIFICIAL_GPUS"
ARTIFICIAL_ACTIVE_ENV = "NNI_AGENT_ARTIFICIAL_ACTIVE_GPUS"
ARTIFICIAL_MEMORY = 16 * 1024**3
ARTIFICIAL_PROCESS_PID = 1  # the fake "someone else's" process on an active artificial GPU
ARTIFICIAL_PROCESS_MEMORY = 512 * 1024**2


class GpuProvider(Protocol):
    count: int

    def sample(self) -> pb.GpuReport: ...


def _now_ms() -> int:
    return int(time.time() * 1000)


class NoGpus:
    provider = "none"
    count = 0

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def sample(self) -> pb.GpuReport:
        return pb.GpuReport(time_ms=_now_ms(), unavailable_reason=self.reason, provider=self.provider)


class ArtificialGpus:
    provider = "artificial"

    def __init__(self, count: int, active: set[int]) -> None:
        self.count = count
        self._active = active

    def sample(self) -> pb.GpuReport:
        report = pb.GpuReport(time_ms=_now_ms(), provider=self.provider)
        for i in range(self.count):
            gpu = report.gpus.add(
                index=i, model=f"Artificial GPU {i}", uuid=f"GPU-artificial-{i}",
                memory_total=ARTIFICIAL_MEMORY, active=i in self._active,
            )
            if i in self._active:
                gpu.processes.add(pid=ARTIFICIAL_PROCESS_PID, used_memory=ARTIFICIAL_PROCESS_MEMORY, type="compute")
                gpu.memory_used = ARTIFICIAL_PROCESS_MEMORY
                gpu.utilization = 50.0
        return report


class NvmlGpus:
    provider = "nvml"

    def __init__(self, nvml: ModuleType) -> None:  # pynvml
        self._nvml = nvml
        self.count = nvml.nvmlDeviceGetCount()

    def sample(self) -> pb.GpuReport:
        nvml = self._nvml
        report = pb.GpuReport(time_ms=_now_ms(), provider=self.provider)
        try:
            for i in range(self.count):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                gpu = report.gpus.add(
                    index=i, model=_text(nvml.nvmlDeviceGetName(handle)), uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    utilization=float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                    memory_used=memory.used, memory_total=memory.total,
                )
                for kind, getter in (("compute", nvml.nvmlDeviceGetComputeRunningProcesses),
                                     ("graphics", nvml.nvmlDeviceGetGraphicsRunningProcesses)):
                    for proc in getter(handle):
                        used = proc.usedGpuMemory
                        gpu.processes.add(pid=proc.pid, used_memory=used if isinstance(used, int) else 0, type=kind)
                gpu.active = len(gpu.processes) > 0
        except nvml.NVMLError as e:
            return pb.GpuReport(time_ms=report.time_ms, provider=self.provider,
                                unavailable_reason=f"NVML query failed: {e}")
        return report


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _artificial(env: Mapping[str, str]) -> GpuProvider:
    raw = env[ARTIFICIAL_GPUS_ENV].strip()
    if not raw.isdigit():
        return NoGpus(f"{ARTIFICIAL_GPUS_ENV}={raw!r} is not a GPU count; set it to a whole number such as 2")
    count = int(raw)
    active: set[int] = set()
    for part in env.get(ARTIFICIAL_ACTIVE_ENV, "").split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) >= count:
            return NoGpus(f"{ARTIFICIAL_ACTIVE_ENV} has {part!r}, which is not a GPU index below {count}; "
                          f"use a comma list such as 0,2")
        active.add(int(part))
    return ArtificialGpus(count, active)


NO_NVML_LIBRARY = "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this machine"


def _nvml_library_present() -> bool:
    """Whether the library pynvml loads on Linux can be loaded at all."""
    if not sys.platform.startswith("linux"):
        return True  # let pynvml search its own places
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def make_gpu_provider(env: Mapping[str, str] = os.environ) -> GpuProvider:
    """NVML if it works, else NoGpus saying why; artificial GPUs when the testing aid asks."""
    if env.get(ARTIFICIAL_GPUS_ENV):
        return _artificial(env)
    if not _nvml_library_present():  # skip importing pynvml (MBs of bindings) on GPU-less workers
        return NoGpus(NO_NVML_LIBRARY)
    try:
        import pynvml
    except ImportError:
        return NoGpus("the nvidia-ml-py package (pynvml) is not installed; pip install nvidia-ml-py")
    try:
        pynvml.nvmlInit()
        return NvmlGpus(pynvml)
    except pynvml.NVMLError_LibraryNotFound:
        return NoGpus(NO_NVML_LIBRARY)
    except pynvml.NVMLError_DriverNotLoaded:
        return NoGpus("NVIDIA driver is not loaded (NVML: driver not loaded)")
    except pynvml.NVMLError as e:
        return NoGpus(f"NVML initialisation failed: {e}")
