"""Hybrid mode in the config: `trainingService` as a list (NNI v2), and NNI v1's
`trainingServicePlatform: hybrid` + `hybridConfig`; every mistake names the field and the fix."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nni_manager.config import ConfigError
from nni_manager.loader import load_config
from nni_manager.config.hybrid import HybridOptions
from tests.support.experiment.configs import SPACE, v2

MACHINE = {"host": "10.0.0.7", "user": "bob", "password": "s3cret-pw", "gpuIndices": [1]}  # not dialed: data only


def hybrid(tmp_path: Path, services: list[dict[str, Any]], **overrides: Any):  # type: ignore[no-untyped-def]
    return load_config(v2(trainingService=services, **overrides), base_dir=tmp_path)


def test_local_plus_remote(tmp_path: Path) -> None:
    config = hybrid(tmp_path, [{"platform": "local", "useActiveGpu": False, "gpuIndices": "0"},
                               {"platform": "remote", "reconnectWindow": "2m", "machineList": [MACHINE]}],
                    trialGpuNumber=1)
    ts = config.training_service
    assert ts.platform == "hybrid" and isinstance(ts.options, HybridOptions)
    local, remote = ts.options.services
    assert (local.platform, local.use_active_gpu, local.gpu_indices) == ("local", False, [0])
    assert remote.platform == "remote" and remote.reconnect_window == 120
    (machine,) = remote.options.machine_list
    assert (machine.host, machine.user, machine.gpu_indices) == ("10.0.0.7", "bob", [1])  # not dialed: data only
    assert "s3cret-pw" not in repr(config)


def test_nni_canonical_form_repeats_shortcuts_in_every_service(tmp_path: Path) -> None:
    """NNI's `ExperimentConfig.json()` copies trialCommand & co. into each training service."""
    code = str(tmp_path)
    config = hybrid(tmp_path, [
        {"platform": "local", "trialCommand": "python train.py", "trialCodeDirectory": code, "trial_gpu_number": 0},
        {"platform": "remote", "trialCommand": "python train.py", "trialCodeDirectory": code, "trialGpuNumber": 0,
         "machineList": [MACHINE]},
    ], trialCodeDirectory=code)
    assert config.trial_command == "python train.py" and config.trial_gpu_number == 0
    assert [s.platform for s in config.training_service.options.services] == ["local", "remote"]


def test_single_entry_is_just_that_service(tmp_path: Path) -> None:
    config = hybrid(tmp_path, [{"platform": "local"}])
    assert config.training_service.platform == "local"


def test_v1_hybrid(tmp_path: Path) -> None:
    """NNI's examples/trials/mnist-tfv1/config_hybrid.yml, as written there."""
    (tmp_path / "search_space.json").write_text('{"lr": {"_type": "choice", "_value": [0.1, 0.01]}}')
    config = load_config({
        "authorName": "default", "experimentName": "example_mnist", "trialConcurrency": 3, "maxExecDuration": "1h",
        "maxTrialNum": 10, "trainingServicePlatform": "hybrid", "searchSpacePath": "search_space.json",
        "useAnnotation": False, "tuner": {"builtinTunerName": "Random", "classArgs": {"optimize_mode": "maximize"}},
        "trial": {"command": "python3 mnist.py", "codeDir": ".", "gpuNum": 0},
        "hybridConfig": {"trainingServicePlatforms": ["local", "remote"]},
        "remoteConfig": {"reuse": True},
        "machineList": [{"ip": "10.1.1.1", "username": "xxx", "passwd": "xxx-pw", "port": 22}],  # not dialed: data only
    }, base_dir=tmp_path)
    local, remote = config.training_service.options.services
    assert (local.platform, remote.platform) == ("local", "remote")
    (machine,) = remote.options.machine_list
    assert (machine.host, machine.user, machine.port) == ("10.1.1.1", "xxx", 22)  # not dialed: data only
    assert remote.options.reuse_mode is True and config.trial_command == "python3 mnist.py"


MISTAKES = [
    # (trainingService list or whole-config overrides, field named, words in the fix)
    ([], "trainingService", "at least one"),
    # a cluster platform combines, and its own fields are checked as when alone
    ([{"platform": "local"}, {"platform": "kubeflow", "operator": "tf-operator"}], "trainingService[1].apiVersion",
     "apiVersion"),
    ([{"platform": "local"}, {"platform": "local"}], "trainingService[1].platform", "each platform once"),
    ([{"platform": "local"}, {"platform": "remote"}], "trainingService[1].machineList", "machineList"),
    ([{"platform": "local"}, {"platform": "remote", "machineList": [MACHINE], "trialCommand": "other"}],
     "trainingService[1].trialCommand", "once at the top level"),
    ([{"platform": "local"}, {"platform": "nosuch"}], "trainingService[1].platform", "local"),
    ([{"platform": "local", "machineLis": []}], "trainingService[0].machineLis", ""),
]


@pytest.mark.parametrize("services,field,fix", MISTAKES, ids=[m[1] + "-" + str(i) for i, m in enumerate(MISTAKES)])
def test_mistakes(services: list[dict[str, Any]], field: str, fix: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        hybrid(tmp_path, services)
    assert info.value.field == field, str(info.value)
    assert fix in (info.value.fix or "") + info.value.problem, str(info.value)


def test_v1_hybrid_mistakes(tmp_path: Path) -> None:
    base = {"trialConcurrency": 1, "trainingServicePlatform": "hybrid", "searchSpace": SPACE,
            "tuner": {"name": "Random"}, "trial": {"command": "python3 t.py", "codeDir": "."}}
    with pytest.raises(ConfigError) as info:
        load_config(base, base_dir=tmp_path)
    assert info.value.field == "hybridConfig" and "trainingServicePlatforms" in info.value.fix
    with pytest.raises(ConfigError) as info:
        load_config({**base, "hybridConfig": {"trainingServicePlatforms": ["local"]},
                     "machineList": [{"ip": "10.1.1.1", "username": "x", "passwd": "y"}]}, base_dir=tmp_path)  # not dialed: data only
    assert info.value.field == "machineList" and "remote" in info.value.problem
