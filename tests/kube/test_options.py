"""One options class per Kubernetes platform (config.py, adl.py), each keeping a secret a podSpec
names out of its repr, as KubeConfig does (a dataclass subclass would otherwise get a generated
__repr__ that prints it: AdlConfig did)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nni_manager.backends.kubernetes.adl import AdlBackend, AdlConfig
from nni_manager.backends.kubernetes.config import FrameworkConfig, KubeConfig, KubeflowConfig
from nni_manager.backends.kubernetes.frameworkcontroller import FrameworkControllerBackend
from nni_manager.backends.kubernetes.kubeflow import KubeflowBackend
from nni_manager.backends.kubernetes.pods import PodsBackend

POD_SPEC = {"containers": [{"name": "trial", "env": [{"name": "API_KEY", "value": "S3cr3t-value"}]}]}


@pytest.mark.parametrize("cls", [KubeConfig, KubeflowConfig, FrameworkConfig, AdlConfig])
def test_podspec_secrets_stay_out_of_every_platforms_repr(cls: type[KubeConfig]) -> None:
    text = repr(cls(pod_spec=POD_SPEC))
    assert "S3cr3t-value" not in text and "'API_KEY', 'value': '***'" in text


def test_each_platform_reads_its_own_options_class() -> None:
    parsers = {PodsBackend: KubeConfig, KubeflowBackend: KubeflowConfig,
               FrameworkControllerBackend: FrameworkConfig, AdlBackend: AdlConfig}
    for backend, cls in parsers.items():
        assert backend.options_type is cls, backend
        assert backend.parse_options.__annotations__["return"] == cls.__name__, backend
    # a field of one platform is not on another's options
    assert not hasattr(KubeConfig(), "operator") and not hasattr(KubeflowConfig(), "framework_template")
    assert not hasattr(FrameworkConfig(), "api_version") and not hasattr(AdlConfig(), "operator")


def _backend(cls: type, opts: KubeConfig) -> Any:
    from nni_manager.config import ExperimentConfig, TrainingServiceConfig

    config = ExperimentConfig(trial_command="python3 train.py", trial_code_directory=Path("."),
                              training_service=TrainingServiceConfig(platform=cls.platform, options=opts))
    return cls(config)


@pytest.mark.parametrize("cls, opts, obj, phase", [
    # TFJob: the newest true condition (the operator appends, and sets Running false when it ends)
    (KubeflowBackend, KubeflowConfig(operator="tf-operator"), {}, "waiting"),
    (KubeflowBackend, KubeflowConfig(operator="tf-operator"), {"status": {"conditions": [
        {"type": "Created", "status": "True"}, {"type": "Running", "status": "True"}]}}, "running"),
    (KubeflowBackend, KubeflowConfig(operator="tf-operator"), {"status": {"conditions": [
        {"type": "Created", "status": "True"}, {"type": "Running", "status": "False"},
        {"type": "Failed", "status": "True"}]}}, "failed"),
    # Framework: status.state, and once completed its completion type, or the stop it was asked
    (FrameworkControllerBackend, FrameworkConfig(), {"status": {"state": "AttemptRunning"}}, "running"),
    (FrameworkControllerBackend, FrameworkConfig(), {"status": {"state": "Completed", "attemptStatus": {
        "completionStatus": {"code": 0, "type": {"name": "Succeeded"}}}}}, "succeeded"),
    (FrameworkControllerBackend, FrameworkConfig(), {"status": {"state": "Completed", "attemptStatus": {
        "completionStatus": {"code": -210, "type": {"name": "Failed"}}}}}, "stopped"),
    (AdlBackend, AdlConfig(), {"status": {"phase": "Stopping"}}, "running"),  # being moved to other nodes
    (AdlBackend, AdlConfig(), {"status": {"phase": "Starting"}}, "waiting"),
    (PodsBackend, KubeConfig(), {"status": {"phase": "Succeeded"}}, "succeeded"),
])
def test_each_platform_maps_its_main_object_onto_a_job_phase(cls: type, opts: KubeConfig, obj: dict[str, Any],
                                                           phase: str) -> None:
    assert _backend(cls, opts).object_phase(obj) == phase
