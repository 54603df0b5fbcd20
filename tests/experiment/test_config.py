"""load_config: NNI v2 and v1 configs, and a ConfigError naming field + fix for each mistake."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nni_manager.config import ConfigError
from nni_manager.loader import load_config
from tests.support.experiment.configs import SPACE, v2


def remote(machine: dict[str, Any]) -> dict[str, Any]:
    return v2(trainingService={"platform": "remote", "machineList": [machine]})


MISTAKES = [
    # (config, field named, words in the fix)
    (v2(trialCommand=None), "trialCommand", "add `trialCommand"),
    (v2(trialConcurrency=None), "trialConcurrency", "add `trialConcurrency"),
    (v2(trialConcurrency="two"), "trialConcurrency", "whole number"),
    (v2(trialConcurrency=0), "trialConcurrency", ">= 1"),
    (v2(maxTrialNumber=-3), "maxTrialNumber", ">= 1"),
    (v2(trialConcurency=2), "trialConcurency", "did you mean `trialConcurrency`?"),
    (v2(maxExperimentDuration="1x"), "maxExperimentDuration", "unit s, m, h or d"),
    (v2(maxTrialDuration="-5m"), "maxTrialDuration", "positive"),
    (v2(trialGpuNumber=1), "trainingService.useActiveGpu", "useActiveGpu: false"),
    (v2(trainingService={"platform": "local", "maxTrialNumberPerGpu": 2}),
     "trainingService.maxTrialNumberPerGpu", "trialGpuNumber"),
    (v2(trialCodeDirectory="no/such/dir"), "trialCodeDirectory", "folder"),
    (v2(trainingService={"platform": "nosuch"}), "trainingService.platform", "local"),
    (v2(trainingService={"platform": "dlc"}), "trainingService.image", "add `image"),
    (v2(trainingService=None), "trainingService.platform", "add `platform"),
    (v2(trainingService={"platform": "remote", "machineList": []}), "trainingService.machineList", "machineList: [{host"),
    (remote({"user": "u"}), "trainingService.machineList[0].host", "add `host"),
    (remote({"host": "127.0.0.1"}), "trainingService.machineList[0].user", "add `user"),
    (remote({"host": "127.0.0.1", "user": "u", "port": 70000}), "trainingService.machineList[0].port", "SSH port"),
    (remote({"host": "127.0.0.1", "user": "u", "sshKeyFile": "/no/key"}),
     "trainingService.machineList[0].sshKeyFile", "private key"),
    (remote({"host": "127.0.0.1", "user": "u", "hots": "x"}),
     "trainingService.machineList[0].hots", "did you mean `host`?"),
    (v2(searchSpace={"lr": {"_type": "loguniformm", "_value": [0.1, 1]}}), "searchSpace.lr._type", "loguniform"),
    (v2(searchSpace={"lr": {"_type": "uniform", "_value": [1, 0]}}), "searchSpace.lr._value", "_value:"),
    (v2(searchSpace={"lr": {"_type": "choice", "_value": []}}), "searchSpace.lr._value", "options"),
    (v2(searchSpace={"lr": {"_type": "loguniform", "_value": [0, 1]}}), "searchSpace.lr._value", "_value:"),
    (v2(searchSpace={"lr": [1, 2]}), "searchSpace.lr", "_type"),
    (v2(searchSpaceFile="nope.json", searchSpace=None), "searchSpaceFile", "JSON or YAML"),
    (v2(tuner={"name": "Random", "classArg": {}}), "tuner.classArg", "did you mean `classArgs`?"),
    (v2(tuner={"className": "My"}), "tuner.className", "my_tuner.MyTuner"),
    (v2(tuner={"className": "my.My"}), "tuner.codeDirectory", "folder"),
    (v2(tuner={"name": "TPE", "className": "my.My"}), "tuner.className", "built-in"),
    (v2(tuner={"name": "TPE", "codeDirectory": "."}), "tuner.codeDirectory", "className"),
    (v2(tuner=None, advisor={"name": "Hyperband"}, assessor={"name": "Medianstop"}), "assessor", "remove the assessor"),
    (v2(advisor={"name": "Hyperband"}), "advisor", "keep one"),
    (v2(assessor={"classArgs": {}}), "assessor.name", "Medianstop"),
    (v2(logLevel="loud"), "logLevel", "debug"),
    (v2(experimentType="nas"), "experimentType", "hpo"),
    (v2(trialKillSignal="SIGFOO"), "trialKillSignal", "SIGTERM"),
    (v2(trainingService={"platform": "local", "gpuIndices": "a,b"}), "trainingService.gpuIndices", "[0, 1]"),
    (v2(trainingService={"platform": "local", "useActiveGpu": "yes"}), "trainingService.useActiveGpu", "true or false"),
    (v2(trainingService={"platform": "local", "operator": "tf-operator"}), "trainingService.operator", "remove it"),
]


@pytest.mark.parametrize("config,field,fix", MISTAKES, ids=[m[1] + "-" + str(i) for i, m in enumerate(MISTAKES)])
def test_mistake_names_field_and_fix(config: dict[str, Any], field: str, fix: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(config, base_dir=tmp_path)
    assert info.value.field == field
    assert fix in info.value.fix
    assert f"`{field}`" in str(info.value) and "Fix:" in str(info.value)


def test_v2_yaml_file_paths_relative_to_file(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "space.json").write_text(json.dumps(SPACE))
    (tmp_path / "exp.yml").write_text(
        "experimentName: demo\n"
        "searchSpaceFile: space.json\n"
        "trialCommand: python train.py\n"
        "trialCodeDirectory: code\n"
        "trialConcurrency: 3\n"
        "trialGpuNumber: 1\n"
        "maxTrialNumber: 10\n"
        "maxExperimentDuration: 1h\n"
        "maxTrialDuration: 90\n"
        "experimentWorkingDirectory: ./nni-experiments\n"
        "trialKillSignal: INT\n"
        "trialGracePeriod: 2s\n"
        "tuner: {name: GridSearch, classArgs: {optimize_mode: minimize}}\n"
        "trainingService:\n  platform: local\n  useActiveGpu: false\n  maxTrialNumberPerGpu: 2\n  gpuIndices: '0,1'\n"
    )
    config = load_config(tmp_path / "exp.yml")
    assert config.trial_code_directory == tmp_path / "code"
    assert config.experiment_working_directory == tmp_path / "nni-experiments"
    assert config.search_space == SPACE
    assert (config.trial_concurrency, config.trial_gpu_number, config.max_trial_number) == (3, 1, 10)
    assert (config.max_experiment_duration, config.max_trial_duration) == (3600, 90)
    assert (config.trial_kill_signal, config.trial_grace_period) == ("SIGINT", 2)
    assert config.tuner is not None and config.tuner.class_args == {"optimize_mode": "minimize"}
    ts = config.training_service
    assert (ts.platform, ts.use_active_gpu, ts.max_trial_number_per_gpu, ts.gpu_indices) == ("local", False, 2, [0, 1])


@pytest.mark.parametrize("text,seconds", [("45s", 45), ("30m", 1800), ("1.5h", 5400), ("1d", 86400), (12, 12), ("7", 7)])
def test_durations(text: Any, seconds: float, tmp_path: Path) -> None:
    assert load_config(v2(maxExperimentDuration=text), base_dir=tmp_path).max_experiment_duration == seconds


def test_v1_names_accepted(tmp_path: Path) -> None:
    key = tmp_path / "id_test"
    key.write_text("not really a key")
    (tmp_path / "space.yml").write_text("lr: {_type: uniform, _value: [0.1, 0.2]}\n")
    config = load_config({
        "authorName": "me",
        "trialConcurrency": 1,
        "maxExecDuration": "2h",
        "maxTrialNum": 5,
        "trainingServicePlatform": "remote",
        "searchSpacePath": "space.yml",
        "tuner": {"builtinTunerName": "Random", "classArgs": {"seed": 3}},
        "trial": {"command": "python t.py", "codeDir": ".", "gpuNum": 1},
        "remoteConfig": {"reuse": False},
        "machineList": [{"ip": "127.0.0.1", "username": "bob", "passwd": "hunter2", "maxTrialNumPerGpu": 2,
                         "sshKeyPath": "id_test", "passphrase": "pp"}],
    }, base_dir=tmp_path)
    assert config.trial_command == "python t.py" and config.trial_gpu_number == 1
    assert (config.max_trial_number, config.max_experiment_duration) == (5, 7200)
    assert config.search_space == {"lr": {"_type": "uniform", "_value": [0.1, 0.2]}}
    assert config.tuner is not None and (config.tuner.name, config.tuner.class_args) == ("Random", {"seed": 3})
    (machine,) = config.training_service.options.machine_list
    assert (machine.host, machine.user, machine.port, machine.max_trial_number_per_gpu) == ("127.0.0.1", "bob", 22, 2)
    assert machine.ssh_key_file == key and machine.strict_host_key_checking is True
    assert config.training_service.options.reuse_mode is False
    assert "hunter2" not in repr(config) and "pp'" not in repr(config)


def test_root_shortcuts(tmp_path: Path) -> None:
    config = load_config(v2(trainingService=None, platform="local", useActiveGpu=True, trialGpuNumber=2,
                            nniManagerIp="127.0.0.1"), base_dir=tmp_path)
    ts = config.training_service
    assert (ts.platform, ts.use_active_gpu, ts.nni_manager_ip) == ("local", True, "127.0.0.1")


def test_shortcut_inside_training_service(tmp_path: Path) -> None:
    config = load_config(v2(trialCommand=None, trainingService={"platform": "local", "trialCommand": "echo"}),
                         base_dir=tmp_path)
    assert config.trial_command == "echo"


def test_remote_fields(tmp_path: Path) -> None:
    config = load_config(remote({"host": "127.0.0.1", "user": "u", "port": 2222, "password": "s3cret",
                                 "sshPassphrase": "pp2", "useActiveGpu": True, "gpuIndices": [1],
                                 "pythonPath": "/opt/py/bin", "proxyCommand": "nc %h %p",
                                 "knownHostsFile": "kh", "strictHostKeyChecking": False}), base_dir=tmp_path)
    (m,) = config.training_service.options.machine_list
    assert (m.port, m.password, m.use_active_gpu, m.gpu_indices, m.python_path) == (2222, "s3cret", True, [1], "/opt/py/bin")
    assert (m.proxy_command, m.known_hosts_file, m.strict_host_key_checking) == ("nc %h %p", tmp_path / "kh", False)
    assert "s3cret" not in repr(config) and "pp2" not in repr(config)


def test_secret_never_in_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(remote({"host": "127.0.0.1", "user": "u", "password": ["hunter2"]}), base_dir=tmp_path)
    assert info.value.field.endswith("password") and "hunter2" not in str(info.value)


def test_planned_platform_says_it_is_not_implemented(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nni_manager.backends import registry

    monkeypatch.setitem(registry.PLANNED, "someday", "A Future Cluster")
    with pytest.raises(ConfigError) as info:
        load_config(v2(trainingService={"platform": "someday", "host": "pai"}), base_dir=tmp_path)
    assert info.value.field == "trainingService.platform"
    assert "not implemented in nni-manager yet" in str(info.value) and "kubeflow" in str(info.value)


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    (tmp_path / "bad.yml").write_text("trialCommand: x\n  trialConcurrency: [\n")
    with pytest.raises(ConfigError, match="line"):
        load_config(tmp_path / "bad.yml")


def test_reconnect_window_and_agent_env(tmp_path: Path) -> None:
    ts = {"platform": "local", "reconnectWindow": "2m", "agentEnv": {"CUDA_HOME": "/opt/cuda", "N": 3}}
    config = load_config(v2(trainingService=ts), base_dir=tmp_path)
    assert config.training_service.reconnect_window == 120
    assert config.training_service.agent_env == {"CUDA_HOME": "/opt/cuda", "N": "3"}
    assert load_config(v2(), base_dir=tmp_path).training_service.reconnect_window is None


@pytest.mark.parametrize("ts,fix", [
    ({"platform": "local", "agentEnv": ["A=1"]}, "agentEnv: {CUDA_HOME"),
    ({"platform": "local", "reconnectWindow": "soon"}, "trainingService.reconnectWindow"),
])
def test_reconnect_window_and_agent_env_mistakes(ts: dict[str, Any], fix: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(v2(trainingService=ts), base_dir=tmp_path)
    assert fix in str(err.value)
