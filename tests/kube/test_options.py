"""One options class per Kubernetes platform (config.py, adl.py), each keeping a secret a podSpec
names out of its repr, as KubeConfig does (a dataclass subclass would otherwise get a generated
__repr__ that prints it: AdlConfig did)."""
from __future__ import annotations

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
        assert backend.options_parser is not None
        assert backend.options_parser.__annotations__["return"] == cls.__name__, backend
    # a field of one platform is not on another's options
    assert not hasattr(KubeConfig(), "operator") and not hasattr(KubeflowConfig(), "framework_template")
    assert not hasattr(FrameworkConfig(), "api_version") and not hasattr(AdlConfig(), "operator")
