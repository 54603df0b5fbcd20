"""Every failure before the first trial is one line (issue 32, item 2): the REAL `nni-manager`
command over a corpus of broken configs and environments. For each: exactly one line on stderr,
naming the field or the cause and the fix; the documented exit status (`nni-manager run --help`:
2 for a config mistake, 3 for a platform that refuses at start); no traceback; no experiment
directory left for a config mistake; and `run --dry-run` and `run --detach` agree with `run`.
Most cases fail at config validation, before any process or directory is created."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.aml.fixtures import AZURE_IDENTITY_VARS, aml_factory  # noqa: F401 (fixture)

CLI = [sys.executable, "-m", "nni_manager"]
DROP = object()  # remove this key from the base config

BASE: dict[str, Any] = {
    "trialCommand": "python trial.py",
    "trialCodeDirectory": "code",
    "trialConcurrency": 1,
    "maxTrialNumber": 2,
    "searchSpace": {"x": {"_type": "choice", "_value": [1, 2]}},
    "tuner": {"name": "GridSearch"},
    "trainingService": {"platform": "local"},
    "experimentWorkingDirectory": "exps",
}
DLC = {"platform": "dlc", "type": "Worker", "image": "python:3.11", "podCount": 1,
       "ecsSpec": "{'resource_id': 'rg1', 'cpu': 2, 'memory': 8, 'gpu': 0}", "region": "share", "workspaceId": "None",
       "nasDataSourceId": "d1", "accessKeyId": "AK", "accessKeySecret": "SK",
       "localStorageMountPoint": "/tmp/nni-corpus-nas", "containerStorageMountPoint": "/mnt/nas"}


@dataclass
class Case:
    name: str
    config: dict[str, Any] | str  # overrides of BASE (DROP removes), or the file's raw text
    words: tuple[str, ...]  # what the one line must say: the field or cause, and the fix
    exit: int = 2
    args: tuple[str, ...] = ()
    env: Callable[[Path], dict[str, str]] | None = None  # extra environment, given the test's folder
    file: str | None = None  # run this path instead of the written config

    def text(self) -> str:
        if isinstance(self.config, str):
            return self.config
        merged = {**BASE}
        for key, value in self.config.items():
            if value is DROP:
                merged.pop(key, None)
            else:
                merged[key] = value
        return yaml.safe_dump(merged)


def _hide_dlc_sdk(tmp: Path) -> dict[str, str]:
    shim = tmp / "shim" / "alibabacloud_pai_dlc20201203"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'alibabacloud_pai_dlc20201203\'", '
                                      'name="alibabacloud_pai_dlc20201203")\n')
    return {"PYTHONPATH": f"{tmp / 'shim'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


CASES = [
    # the issue's own cases
    Case("unknown-key-before-missing", {"trialConcurrency": DROP, "trialConcurency": 1},
         ("`trialConcurency`", "unknown field", "did you mean `trialConcurrency`")),
    Case("misspelled-tuner", {"tuner": {"name": "TPEE"}}, ("tuner.name", "'TPEE'", "did you mean `TPE`")),
    Case("optimize-mode-maximise", {"tuner": {"name": "TPE", "classArgs": {"optimize_mode": "maximise"}}},
         ("tuner.classArgs.optimize_mode", "'maximise'", "did you mean `maximize`")),
    Case("no-tuner", {"tuner": DROP}, ("`tuner`", "is required", "add `tuner:")),
    Case("kubernetes-no-kubeconfig", {"trainingService": {"platform": "kubernetes"}},
         ("trainingService.kubeConfig", "no kubeconfig", "set `kubeConfig:")),
    Case("working-directory-not-writable", {"experimentWorkingDirectory": "/proc/nni-corpus-exps"},
         ("experimentWorkingDirectory", "cannot be written", "choose a directory you can write")),
    Case("dlc-without-sdk", {"trainingService": DLC, "nniManagerIp": "127.0.0.1"},  # not dialed
         ("trainingService.platform", "PAI-DLC SDK", "pip install"), env=_hide_dlc_sdk),
    # built-in algorithms and their classArgs, before start
    Case("tuner-classargs-unknown", {"tuner": {"name": "TPE", "classArgs": {"seeed": 1}}},
         ("tuner.classArgs.seeed", "not an argument of TPE", "did you mean `seed`")),
    Case("assessor-misspelled", {"assessor": {"name": "Medianstopp"}},
         ("assessor.name", "'Medianstopp'", "did you mean `Medianstop`")),
    Case("assessor-classargs-validator", {"assessor": {"name": "Medianstop", "classArgs": {"start_step": -1}}},
         ("assessor.classArgs", "start_step", "NNI's docs")),
    Case("assessor-as-tuner", {"tuner": {"name": "Medianstop"}}, ("tuner.name", "is an assessor", "use one of")),
    Case("advisor-misspelled", {"tuner": DROP, "advisor": {"name": "Hyperbandd"}},
         ("advisor.name", "did you mean `Hyperband`")),
    Case("gridsearch-optimize-mode-number", {"tuner": {"name": "GridSearch", "classArgs": {"optimize_mode": 3}}},
         ("tuner.classArgs.optimize_mode", "must be maximize or minimize")),
    Case("tuner-name-and-classname", {"tuner": {"name": "TPE", "className": "my.Tuner"}},
         ("tuner.className", "given together with `name`", "use `name`")),
    Case("tuner-classname-no-module", {"tuner": {"className": "MyTuner", "codeDirectory": "code"}},
         ("tuner.className", "module.Class", "write e.g.")),
    Case("tuner-no-name", {"tuner": {"classArgs": {"optimize_mode": "maximize"}}},
         ("tuner.name", "is required", "add `name:")),
    # the file itself
    Case("yaml-syntax", "trialCommand: [python\n", ("(file)", "not valid YAML", "fix the YAML")),
    Case("empty-file", "", ("(root)", "the config is empty", "write at least")),
    Case("not-a-mapping", "- a\n- b\n", ("(root)", "must be a mapping", "key: value")),
    Case("no-such-file", {}, ("(file)", "cannot read", "existing YAML file"), file="no-such-config.yml"),
    # top-level fields
    Case("no-search-space", {"searchSpace": DROP}, ("searchSpace", "is required", "searchSpaceFile")),
    Case("search-space-file-missing", {"searchSpace": DROP, "searchSpaceFile": "nope.json"},
         ("searchSpaceFile", "nope.json")),
    Case("search-space-bad-type", {"searchSpace": {"x": {"_type": "choise", "_value": [1]}}},
         ("searchSpace", "choise", "choice")),
    Case("search-space-a-list", {"searchSpace": [1, 2]}, ("searchSpace", "mapping")),
    Case("no-trial-command", {"trialCommand": DROP}, ("trialCommand", "is required", "add `trialCommand:")),
    Case("code-directory-missing", {"trialCodeDirectory": "nope"},
         ("trialCodeDirectory", "is not an existing directory", "point it at")),
    Case("trial-concurrency-zero", {"trialConcurrency": 0}, ("trialConcurrency", ">= 1")),
    Case("trial-concurrency-words", {"trialConcurrency": "two"}, ("trialConcurrency", "must be an integer")),
    Case("max-trial-number-negative", {"maxTrialNumber": -1}, ("maxTrialNumber", ">=")),
    Case("max-duration-bad-unit", {"maxExperimentDuration": "1x"}, ("maxExperimentDuration",)),
    Case("max-trial-duration-negative", {"maxTrialDuration": "-5s"}, ("maxTrialDuration",)),
    Case("log-level-unknown", {"logLevel": "verbose"}, ("logLevel", "verbose")),
    Case("gpu-number-negative", {"trialGpuNumber": -1}, ("trialGpuNumber", ">= 0")),
    Case("unknown-root-key", {"trialCommandd": "x"}, ("trialCommandd", "unknown field")),
    Case("working-directory-is-a-file", {"experimentWorkingDirectory": "trial-file/exps"},
         ("experimentWorkingDirectory", "is not a directory", "point experimentWorkingDirectory")),
    # the training service
    Case("no-training-service", {"trainingService": DROP}, ("trainingService", "is required")),
    Case("platform-misspelled", {"trainingService": {"platform": "locall"}},
         ("trainingService.platform", "'locall'", "use one of")),
    Case("nested-key-misspelled", {"trainingService": {"platform": "local", "useActivGpu": True}},
         ("trainingService.useActivGpu", "unknown field", "did you mean `useActiveGpu`")),
    Case("remote-no-machines", {"trainingService": {"platform": "remote"}},
         ("trainingService.machineList", "is required", "add `machineList:")),
    Case("remote-machine-no-host", {"trainingService": {"platform": "remote", "machineList": [{"user": "x"}]}},
         ("trainingService.machineList[0].host", "is required")),
    Case("openpai-no-host", {"trainingService": {"platform": "openpai"}}, ("trainingService.host", "is required")),
    Case("slurm-no-manager-ip", {"trainingService": {"platform": "slurm"}}, ("nniManagerIp", "is required")),
    Case("dlc-no-image", {"trainingService": {**DLC, "image": DROP}, "nniManagerIp": "127.0.0.1"},  # not dialed
         ("trainingService.image", "is required")),
    # the command line
    Case("port-out-of-range", {}, ("--port 70000", "0-65535"), args=("--port", "70000")),
]
for case in CASES:  # DROP inside a nested mapping
    if isinstance(case.config, dict):
        for key, value in case.config.items():
            if isinstance(value, dict):
                case.config[key] = {k: v for k, v in value.items() if v is not DROP}


def _cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=180, env=env)


def _check_one_line(result: subprocess.CompletedProcess[str], case: Case, mode: str) -> str:
    where = f"{case.name} ({mode})"
    assert "Traceback" not in result.stderr, f"{where}: {result.stderr}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"{where}: not one line on stderr: {result.stderr!r}"
    line = lines[0]
    assert line.startswith("nni-manager: "), f"{where}: {line}"
    for word in case.words:
        assert word in line, f"{where}: {word!r} missing from: {line}"
    fixes = ("fix", "check", "add ", "use ", "set ", "pass ", "install", "assign", "grant", "choose", "remove")
    assert any(w in line.lower() for w in fixes), f"{where}: names no fix: {line}"
    assert result.returncode == case.exit, f"{where}: exit {result.returncode}, documented {case.exit}: {line}"
    return line


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 40 and len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_broken_config_is_one_line_and_agrees_across_modes(case: Case, tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "trial.py").write_text("print('never runs')\n")
    (tmp_path / "trial-file").write_text("a file where a directory is expected\n")
    home = tmp_path / "home"
    home.mkdir()
    config = tmp_path / "config.yml"
    config.write_text(case.text())
    env = {**os.environ, "HOME": str(home), **(case.env(tmp_path) if case.env else {})}
    env.pop("KUBECONFIG", None)
    target = case.file or str(config)
    modes = {"run": ["run", target, "--plain", "--no-webui", *case.args],
             "dry-run": ["run", target, "--dry-run", *case.args],
             "detach": ["run", target, "--detach", "--port", "0", *case.args]}
    with ThreadPoolExecutor(len(modes)) as pool:
        results = dict(zip(modes, pool.map(lambda a: _cli(a, tmp_path, env), modes.values())))
    lines = {mode: _check_one_line(result, case, mode) for mode, result in results.items()}
    assert len(set(lines.values())) == 1, f"{case.name}: the modes disagree: {lines}"
    for mode, result in results.items():
        assert result.stdout.strip() == "", f"{case.name} ({mode}) printed: {result.stdout}"
    exps = tmp_path / "exps"
    assert not exps.exists() or not any(exps.iterdir()), f"{case.name}: left {list(exps.iterdir())}"
    assert not (home / "nni-experiments").exists() or not any((home / "nni-experiments").iterdir())


# -- platforms that refuse at start: one line naming the cause and the fix, exit 3, run and --detach alike --

def _start_failure(config: dict[str, Any], tmp_path: Path, env: dict[str, str], words: tuple[str, ...]) -> None:
    (tmp_path / "code").mkdir(exist_ok=True)
    (tmp_path / "code" / "trial.py").write_text("print('never runs')\n")
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "HOME": str(home), **env}
    case = Case("platform refuses at start", {}, words, exit=3)
    lines = {}
    for mode, args in (("run", ["run", str(path), "--plain", "--no-webui"]),
                       ("detach", ["run", str(path), "--detach", "--port", "0"])):
        result = _cli(args, tmp_path, env)
        lines[mode] = _check_one_line(result, case, mode)
        assert "could not start" in lines[mode] and "nnimanager.log" in lines[mode], lines[mode]
    assert lines["run"].split(" (details: ")[0] == lines["detach"].split(" (details: ")[0], lines
    dry = _cli(["run", str(path), "--dry-run"], tmp_path, env)  # renders without contacting the platform
    assert dry.returncode == 0 and dry.stderr == "", dry.stderr


def test_slurm_without_its_controller_is_one_line(tmp_path: Path) -> None:
    if not Path("/usr/bin/sbatch").exists() and not any(
            (Path(d) / "sbatch").exists() for d in os.environ.get("PATH", "").split(os.pathsep)):
        pytest.skip("Slurm's client commands are not installed")
    conf = tmp_path / "slurm.conf"  # a controller on a loopback port where nothing listens
    conf.write_text("ClusterName=nocontroller\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=1\n"  # netns only
                    "AuthType=auth/none\nCredType=cred/none\nMessageTimeout=2\n"
                    "NodeName=n1 NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=n1 Default=YES\n")
    config = {**BASE, "trainingService": {"platform": "slurm"}, "nniManagerIp": "127.0.0.1"}  # not dialed
    _start_failure(config, tmp_path, {"SLURM_CONF": str(conf)},
                   ("controller cannot be reached", "slurmctld", "scontrol ping"))


def test_aml_refusing_the_identity_is_one_line(aml_factory, tmp_path: Path) -> None:
    aml = aml_factory()
    config = {**BASE, "trialCommand": f"{sys.executable} trial.py", "nniManagerIp": "127.0.0.1",  # not dialed
              "trainingService": {**aml.aml_config(), "pollInterval": "0.3s"}}
    _start_failure(config, tmp_path, {**{k: "" for k in AZURE_IDENTITY_VARS if k in os.environ}, **aml.env("norole")},
                   ("403", "AuthorizationFailed", "AzureML Data Scientist"))
