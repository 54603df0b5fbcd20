"""NNI's own algorithms, unmodified: the real `nni` 3.0 dispatcher process (`python -m nni`) over
the WebSocket tuner command channel, with real trials using NNI's SDK on the local backend."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from nni_manager.config import ConfigError
from nni_manager.loader import load_config
from nni_manager.dispatcher import DispatcherError
from nni_manager.experiment import Experiment
from nni_manager.types import TrialJobStatus

from tests.support.experiment.fixtures import processes_under

NNI_MISSING = "" if importlib.util.find_spec("nni") else "the real nni package is not installed; pip install nni==3.0"
pytestmark = pytest.mark.skipif(bool(NNI_MISSING), reason=NNI_MISSING or "-")

TRIAL = """
import time
import nni
p = nni.get_next_parameter()
x = p.get("x", 1)
for step in range(p.get("steps", 3)):
    nni.report_intermediate_result(x * (step + 1))
    time.sleep(p.get("pause", 0))
nni.report_final_result(x)
"""

CUSTOM_TUNER = '''
import json, pathlib
from nni.tuner import Tuner

class CountingTuner(Tuner):
    """Proposes x = start, start+1, ...; records what NNI's dispatcher tells it."""
    def __init__(self, start=100, log="results.jsonl", fail_after=None, extra=None):
        self.next, self.log, self.fail_after, self.made = start, pathlib.Path(log), fail_after, 0
        self.extra = extra or {}
    def update_search_space(self, space):
        self.space = space
    def generate_parameters(self, parameter_id, **kwargs):
        if self.fail_after is not None and self.made >= self.fail_after:
            raise RuntimeError("boom: the tuner broke on purpose")
        self.made += 1
        self.next += 1
        return {"x": self.next - 1, **self.extra}
    def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
        with self.log.open("a") as f:
            f.write(json.dumps({"id": parameter_id, "x": parameters["x"], "value": value}) + "\\n")

from nni.assessor import Assessor, AssessResult

class CrashingAssessor(Assessor):
    """Breaks while trials run: on the second intermediate result it sees."""
    def __init__(self):
        self.calls = 0
    def assess_trial(self, trial_job_id, trial_history):
        self.calls += 1
        if self.calls >= 2:
            raise RuntimeError("boom: the assessor broke on purpose")
        return AssessResult.Good

'''


@pytest.fixture(autouse=True)
def _nnis_dispatcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Random and GridSearch too run in NNI's dispatcher here (tests/conftest.py moves them in process)."""
    monkeypatch.delenv("NNI_MANAGER_BUILTIN_TUNERS", raising=False)


@pytest.fixture
def nni_code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text(textwrap.dedent(TRIAL))
    (code / "my_tuners.py").write_text(textwrap.dedent(CUSTOM_TUNER))
    return code


def _config(tmp_path: Path, **fields: Any):
    config: dict[str, Any] = {
        "trialCommand": "python trial.py", "trialCodeDirectory": "code", "trialConcurrency": 2,
        "maxTrialNumber": 4, "searchSpace": {"x": {"_type": "choice", "_value": [1, 2, 3, 4, 5]}},
        "trainingService": {"platform": "local"}, "experimentWorkingDirectory": "exps", "trialGracePeriod": 2,
    }
    config.update(fields)
    config = {k: v for k, v in config.items() if v is not None}
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    return load_config(path)


def _run(config) -> tuple[Experiment, Any]:
    experiment = Experiment(config, poll_interval=0.2)
    return experiment, asyncio.run(experiment.run())


@pytest.mark.parametrize("name,args", [
    ("TPE", {"optimize_mode": "maximize", "seed": 1}),
    pytest.param("Anneal", {"optimize_mode": "maximize"}, marks=pytest.mark.skipif(
        not importlib.util.find_spec("hyperopt"), reason="NNI's Anneal needs hyperopt: pip install hyperopt")),
    ("Evolution", {"optimize_mode": "maximize", "population_size": 4}),
])
def test_nni_tuners(name: str, args: dict[str, Any], tmp_path: Path, nni_code: Path) -> None:
    config = _config(tmp_path, tuner={"name": name, "classArgs": args})
    experiment, result = _run(config)
    assert len(result.trials) == 4 and result.stop_reason.startswith("maxTrialNumber")
    assert all(t.status == TrialJobStatus.SUCCEEDED for t in result.trials)
    assert all(t.parameters["x"] in (1, 2, 3, 4, 5) and t.final == t.parameters["x"] for t in result.trials)
    assert result.best is not None and result.best.metric == max(t.metric for t in result.trials)
    records = [json.loads(t.hyper_params) for t in result.trials]
    assert sorted(r["parameter_id"] for r in records) == [0, 1, 2, 3]  # the records NNI's dispatcher sent
    assert (result.experiment_dir / "log" / "dispatcher.log").is_file()


def test_hyperband_advisor_runs_as_in_nni_3(tmp_path: Path, nni_code: Path) -> None:
    """NNI 3.0's Hyperband gets its trials out, then fails on their first metric inside NNI itself
    (nni/recoverable.py compares its string parameter ids such as "0-2_0_0" with an int), as it
    does under NNI's own manager: the failure must be reported with NNI's words, trials cleaned up."""
    config = _config(tmp_path, maxTrialNumber=6, trialConcurrency=2,
                     advisor={"name": "Hyperband", "classArgs": {"optimize_mode": "maximize", "R": 4, "eta": 2}})
    experiment = Experiment(config, poll_interval=0.2)
    try:
        result = asyncio.run(experiment.run())
    except DispatcherError as e:  # NNI 3.0
        assert "'<=' not supported between instances of 'str' and 'int'" in str(e)
        assert "hyperband_advisor.py" in str(e)
        result = experiment.result()
    else:  # an NNI with the comparison fixed runs the rounds through
        assert len(result.trials) == 6
    assert result.trials and all("TRIAL_BUDGET" in t.parameters for t in result.trials)
    assert all(isinstance(t.parameter_id, str) for t in result.trials)  # Hyperband's own ids reached the trials
    assert all(t.status.is_terminal for t in result.trials)
    assert processes_under(config.trial_code_directory) == []


def test_medianstop_assessor_early_stops_a_bad_trial(tmp_path: Path, nni_code: Path) -> None:
    config = _config(tmp_path, trialConcurrency=1, maxTrialNumber=2,
                     searchSpace={"x": {"_type": "choice", "_value": [10, 1]}, "steps": {"_type": "choice", "_value": [12]},
                                  "pause": {"_type": "choice", "_value": [0.25]}},
                     tuner={"name": "GridSearch"},
                     assessor={"name": "Medianstop", "classArgs": {"optimize_mode": "maximize", "start_step": 2}})
    experiment, result = _run(config)
    good, bad = result.trials
    assert (good.parameters["x"], good.status) == (10, TrialJobStatus.SUCCEEDED)
    assert (bad.parameters["x"], bad.status) == (1, TrialJobStatus.EARLY_STOPPED)
    assert bad.final is None and 2 <= bad.intermediate_count < 12
    assert processes_under(config.trial_code_directory) == []


def test_curvefitting_assessor_runs(tmp_path: Path, nni_code: Path) -> None:
    config = _config(tmp_path, trialConcurrency=2, maxTrialNumber=3,
                     searchSpace={"x": {"_type": "choice", "_value": [1, 2, 3]}, "steps": {"_type": "choice", "_value": [8]}},
                     tuner={"name": "Random", "classArgs": {"seed": 3}},
                     assessor={"name": "Curvefitting", "classArgs": {"epoch_num": 8, "start_step": 3, "threshold": 0.9}})
    experiment, result = _run(config)
    assert len(result.trials) == 3 and not result.error
    assert all(t.status in (TrialJobStatus.SUCCEEDED, TrialJobStatus.EARLY_STOPPED) for t in result.trials)


def test_customised_tuner(tmp_path: Path, nni_code: Path) -> None:
    config = _config(tmp_path, maxTrialNumber=3, searchSpace={"x": {"_type": "choice", "_value": [0]}},
                     tuner={"codeDirectory": "code", "className": "my_tuners.CountingTuner",
                            "classArgs": {"start": 100, "log": str(tmp_path / "results.jsonl")}})
    experiment, result = _run(config)
    assert sorted(t.parameters["x"] for t in result.trials) == [100, 101, 102]
    seen = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted((r["x"], r["value"]) for r in seen) == [(100, 100), (101, 101), (102, 102)]  # metrics reached it


def test_crashing_dispatcher_is_a_clear_error_and_trials_are_cleaned_up(tmp_path: Path, nni_code: Path) -> None:
    config = _config(tmp_path, maxTrialNumber=10, trialConcurrency=2,
                     searchSpace={"x": {"_type": "choice", "_value": [0]}, "steps": {"_type": "choice", "_value": [200]},
                                  "pause": {"_type": "choice", "_value": [0.2]}},
                     tuner={"codeDirectory": "code", "className": "my_tuners.CountingTuner",
                            "classArgs": {"extra": {"steps": 200, "pause": 0.2}}},
                     assessor={"codeDirectory": "code", "className": "my_tuners.CrashingAssessor"})
    experiment = Experiment(config, poll_interval=0.2)
    with pytest.raises(DispatcherError) as info:
        asyncio.run(experiment.run())
    assert "boom: the assessor broke on purpose" in str(info.value) and "my_tuners.py" in str(info.value)
    assert experiment.status == "ERROR" and experiment.result().error
    assert [t.status for t in experiment.trials.values()] == [TrialJobStatus.USER_CANCELED] * 2
    assert processes_under(config.trial_code_directory) == []


def test_dispatcher_that_cannot_start_names_the_reason(tmp_path: Path, nni_code: Path) -> None:
    # a built-in name NNI does not know is a config error before start (as NNI 2.x's nnictl checked)
    with pytest.raises(ConfigError, match="no built-in tuner is named 'NoSuchTuner'"):
        Experiment(_config(tmp_path, tuner={"name": "NoSuchTuner"}))
    # a customised tuner NNI's dispatcher cannot import fails at its start, with NNI's reason
    config = _config(tmp_path, tuner={"className": "no_such_module.NoSuchTuner", "codeDirectory": str(nni_code)})
    with pytest.raises(DispatcherError, match="no_such_module"):
        _run(config)


def test_without_nni_other_algorithms_say_pip_install(tmp_path: Path, nni_code: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("nni_manager.dispatcher.nni_available", lambda: False)  # as where nni is not installed
    with pytest.raises(ConfigError, match="pip install nni"):
        Experiment(_config(tmp_path, tuner={"name": "TPE"}))
    with pytest.raises(ConfigError, match="pip install nni"):
        Experiment(_config(tmp_path, tuner={"name": "Random"}, assessor={"name": "Medianstop"}))
    experiment, result = _run(_config(tmp_path, tuner={"name": "GridSearch"}, maxTrialNumber=10))
    assert sorted(t.parameters["x"] for t in result.trials) == [1, 2, 3, 4, 5]  # built-in, exhausted
    assert result.stop_reason == "the tuner has no more parameters"
    assert not (result.experiment_dir / "log" / "dispatcher.log").exists()


def test_snake_case_keys_and_log_level(tmp_path: Path, nni_code: Path) -> None:
    config = _config(tmp_path, trialCommand=None, trial_command="python trial.py", max_trial_number=2,
                     maxTrialNumber=None, log_level="debug", tuner={"name": "Random", "class_args": {"seed": 1}})
    assert config.max_trial_number == 2 and config.log_level == "debug"
    assert config.tuner is not None and config.tuner.class_args == {"seed": 1}  # classArgs values stay as written
    experiment, result = _run(config)
    log = (result.experiment_dir / "log" / "nnimanager.log").read_text()
    assert "dispatcher -> manager: TR" in log  # debug lines are kept at logLevel debug
    assert "DEBUG" in (result.experiment_dir / "log" / "dispatcher.log").read_text()


def test_python_api_shaped_like_nni(tmp_path: Path, nni_code: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # the WebUI registers in ~/nni-experiments/.experiment
    from nni.experiment import ExperimentConfig as NniConfig

    from nni_manager import Experiment as ApiExperiment

    nni_config = NniConfig("local")
    nni_config.trial_command = "python trial.py"
    nni_config.trial_code_directory = str(nni_code)
    nni_config.trial_concurrency = 2
    nni_config.max_trial_number = 3
    nni_config.search_space = {"x": {"_type": "choice", "_value": [1, 2, 3]}}
    nni_config.tuner.name = "TPE"
    nni_config.tuner.class_args = {"optimize_mode": "maximize"}
    nni_config.experiment_working_directory = str(tmp_path / "exps")
    experiment = ApiExperiment(nni_config)
    assert experiment.run(port=0) is True
    try:
        assert experiment.get_status() == "DONE"
        jobs = experiment.list_trial_jobs()
        assert len(jobs) == 3 and {j.status for j in jobs} == {"SUCCEEDED"}
        data = experiment.export_data()
        assert sorted((d.parameter["x"], d.value) for d in data) == sorted(
            (j.hyperParameters[0].parameters["x"], j.finalMetricData[0].data) for j in jobs)
    finally:
        experiment.stop()


def test_nni_sklearn_example_unchanged_with_tpe_and_medianstop(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    example = Path(__file__).parent / "nni_configs" / "examples" / "trials" / "sklearn" / "classification"
    work = tmp_path / "classification"
    shutil.copytree(example, work)
    (work / "main.py.txt").rename(work / "main.py")  # NNI's trial code, byte for byte (stored as .txt: not linted)
    config = yaml.safe_load((work / "config.yml").read_text())
    # NNI's config as shipped, shortened for a test run, with NNI's integration-test assessor added
    config.update({"maxTrialNumber": 3, "trialConcurrency": 2, "experimentWorkingDirectory": str(tmp_path / "exps"),
                   "assessor": {"name": "Medianstop", "classArgs": {"optimize_mode": "maximize"}}})
    config["trialCommand"] = config["trialCommand"].replace("python3", "python")
    (work / "config.yml").write_text(yaml.safe_dump(config))
    experiment, result = _run(load_config(work / "config.yml"))
    assert len(result.trials) == 3
    assert all(t.status == TrialJobStatus.SUCCEEDED for t in result.trials), [t.message for t in result.trials]
    assert all(0 < t.metric <= 1 for t in result.trials)  # an SVC's accuracy on the digits
    assert set(result.trials[0].parameters) == {"C", "kernel", "degree", "gamma", "coef0"}


SLOW_IMPORT_TUNER = '''
import pathlib, signal, sys, time

_here = pathlib.Path(__file__).parent


def _stopped(signum, frame):
    (_here / "stopped_by").write_text(signal.Signals(signum).name)
    sys.exit(0)


signal.signal(signal.SIGTERM, _stopped)
(_here / "importing").write_text("")
time.sleep(600)  # a tuner whose libraries take long to import: Ctrl-C comes first

from nni.tuner import Tuner


class SlowTuner(Tuner):
    def update_search_space(self, space):
        pass

    def generate_parameters(self, parameter_id, **kwargs):
        return {"x": 1}

    def receive_trial_result(self, parameter_id, parameters, value, **kwargs):
        pass
'''


def test_ctrl_c_while_the_dispatcher_starts_stops_it_and_leaves_no_pipe_or_process(tmp_path: Path,
                                                                                   nni_code: Path) -> None:
    """Ctrl-C before NNI's dispatcher has connected: nobody can send it TERMINATE, so it gets
    SIGTERM at once (it was left 30 s to exit by itself, then SIGKILLed); the manager's stdout and
    stderr reach EOF (no child holds them) and no process is left under the directory."""
    (nni_code / "slow_tuner.py").write_text(SLOW_IMPORT_TUNER)
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump({
        "trialCommand": "python trial.py", "trialCodeDirectory": "code", "trialConcurrency": 1,
        "maxTrialNumber": 1, "searchSpace": {"x": {"_type": "choice", "_value": [1]}},
        "tuner": {"codeDirectory": "code", "className": "slow_tuner.SlowTuner"},
        "trainingService": {"platform": "local"}, "experimentWorkingDirectory": "exps"}))
    proc = subprocess.Popen([sys.executable, "-m", "nni_manager", "run", "--plain", "--port", "0", str(config)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HOME": str(tmp_path)})
    try:
        deadline = time.monotonic() + 60
        while not (nni_code / "importing").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "the dispatcher never started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)  # EOF on both pipes: the manager and every child let go
    finally:
        proc.kill()
    assert proc.returncode == 130, out + err
    assert "stopped: interrupted" in out and "Traceback" not in err, out + err
    assert (nni_code / "stopped_by").read_text() == "SIGTERM"  # told to stop, not SIGKILLed 30 s later
    assert processes_under(tmp_path) == []
