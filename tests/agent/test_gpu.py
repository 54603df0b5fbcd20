"""GPU sampling degrades to "zero GPUs, because ..." and offers artificial GPUs for tests."""
from __future__ import annotations

import pytest

from nni_agent.gpu import make_gpu_provider


def _nvml_works() -> bool:
    try:
        import pynvml
        pynvml.nvmlInit()
        return True
    except Exception:
        return False


@pytest.mark.skipif(_nvml_works(), reason="this machine has a working NVIDIA driver")
def test_without_nvml_reports_zero_gpus_and_why() -> None:
    provider = make_gpu_provider({})
    report = provider.sample()
    assert provider.count == 0
    assert report.provider == "none"
    assert list(report.gpus) == []
    assert "NVML" in report.unavailable_reason and "libnvidia-ml.so.1" in report.unavailable_reason
    assert report.time_ms > 0


@pytest.mark.skipif(not _nvml_works(), reason="needs an NVIDIA GPU and driver")
def test_real_nvml_sample() -> None:
    provider = make_gpu_provider({})
    report = provider.sample()
    assert report.provider == "nvml" and report.unavailable_reason == ""
    assert provider.count == len(report.gpus) > 0
    for i, gpu in enumerate(report.gpus):
        assert gpu.index == i and gpu.model and gpu.uuid.startswith("GPU-") and gpu.memory_total > 0
        assert gpu.active == (len(gpu.processes) > 0)


def test_artificial_gpus_with_active_ones() -> None:
    provider = make_gpu_provider({"NNI_AGENT_ARTIFICIAL_GPUS": "4", "NNI_AGENT_ARTIFICIAL_ACTIVE_GPUS": "0, 2"})
    report = provider.sample()
    assert provider.count == 4 and report.provider == "artificial" and report.unavailable_reason == ""
    assert [g.index for g in report.gpus] == [0, 1, 2, 3]
    assert [g.model for g in report.gpus] == [f"Artificial GPU {i}" for i in range(4)]
    assert all(g.memory_total == 16 * 1024**3 for g in report.gpus)
    assert [g.active for g in report.gpus] == [True, False, True, False]
    assert [len(g.processes) for g in report.gpus] == [1, 0, 1, 0]
    assert len({g.uuid for g in report.gpus}) == 4


@pytest.mark.parametrize(("env", "needle"), [
    ({"NNI_AGENT_ARTIFICIAL_GPUS": "two"}, "NNI_AGENT_ARTIFICIAL_GPUS='two' is not a GPU count"),
    ({"NNI_AGENT_ARTIFICIAL_GPUS": "-1"}, "is not a GPU count"),
    ({"NNI_AGENT_ARTIFICIAL_GPUS": "2", "NNI_AGENT_ARTIFICIAL_ACTIVE_GPUS": "5"}, "'5', which is not a GPU index below 2"),
    ({"NNI_AGENT_ARTIFICIAL_GPUS": "2", "NNI_AGENT_ARTIFICIAL_ACTIVE_GPUS": "a"}, "not a GPU index"),
])
def test_bad_artificial_settings_explain_themselves(env: dict[str, str], needle: str) -> None:
    provider = make_gpu_provider(env)
    report = provider.sample()
    assert provider.count == 0 and report.provider == "none" and list(report.gpus) == []
    assert needle in report.unavailable_reason
