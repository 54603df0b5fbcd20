"""`nni-manager optuna` on the local platform with the real optuna package and a SQLite study.

Each launched trial runs one Optuna trial of an unmodified objective (objectives.py) whose
storage is the agent's 127.0.0.1 endpoint only; the study afterwards holds exactly n_trials
finished trials whose params and values are those each objective saw and returned.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from nni_manager.store import Store  # noqa: E402
from nni_manager.types import TrialJobStatus  # noqa: E402

CLI = [sys.executable, "-m", "nni_manager"]
HERE = Path(__file__).parent


@pytest.fixture
def study_dir(short_dir: Path) -> Path:
    code = short_dir / "code"
    code.mkdir()
    shutil.copy(HERE / "objectives.py", code / "objectives.py")
    (short_dir / "config.yml").write_text(
        "trialCodeDirectory: code\ntrialConcurrency: {concurrency}\nexperimentWorkingDirectory: exps\n"
        "trainingService:\n  platform: local\n")
    return short_dir


def run_study(where: Path, target: str, n_trials: int, *extra: str, concurrency: int = 2,
              study: str = "s", config_extra: str = "") -> tuple[subprocess.CompletedProcess[str], list]:
    config = where / "config.yml"
    config.write_text(config.read_text().replace("{concurrency}", str(concurrency)) + config_extra)
    storage = f"sqlite:///{where / 'db' / 'study.db'}"
    (where / "db").mkdir(exist_ok=True)
    result = subprocess.run([*CLI, "optuna", target, "--study-name", study, "--storage", storage,
                             "--n-trials", str(n_trials), "--config", str(config), "--plain", "--no-webui", *extra],
                            cwd=where, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    trials = optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
    return result, trials


def nni_trials(where: Path) -> dict[str, TrialJobStatus]:
    (exp_dir,) = (where / "exps").iterdir()
    store = Store.open_readonly(exp_dir)
    try:
        return {t.id: t.status for t in store.trials()}
    finally:
        store.close()


def nni_finals(where: Path) -> dict[str, dict]:
    """The final metric each trial reported to the experiment (what `trials` and the WebUI show)."""
    (exp_dir,) = (where / "exps").iterdir()
    store = Store.open_readonly(exp_dir)
    try:
        return {m["trial_id"]: json.loads(json.loads(m["data"])["value"]) for m in store.metrics()
                if m["type"] == "FINAL"}
    finally:
        store.close()


def seen(where: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (where / "code" / "seen").glob("*.json")}


def check_each_saw_its_trial(where: Path, trials: list) -> dict[str, dict]:
    """Every Optuna trial is one NNI trial's, with the params and values its objective saw and returned."""
    records = seen(where)
    statuses = nni_trials(where)
    finals = nni_finals(where)
    assert len(records) == len(trials) == len(statuses)
    for t in trials:
        trial_id = t.system_attrs["nni:trial_id"]
        record = records[trial_id]
        assert record["number"] == t.number and record["params"] == t.params
        if t.state == optuna.trial.TrialState.COMPLETE:
            assert record["returned"] == t.values
            assert finals[trial_id]["default"] == t.values[0] and finals[trial_id]["optuna_trial"] == t.number
            assert finals[trial_id].get("values", t.values) == t.values
        else:
            assert trial_id not in finals
    return records


def check_only_the_agent(where: Path, records: dict[str, dict]) -> None:
    """The trial's storage is the agent's loopback endpoint, with its own token; nothing names the study's."""
    for record in records.values():
        assert record["storage_class"] == "AgentStorageProxy"
        assert record["storage_at"] == record["endpoint"] and record["endpoint"].startswith("127.0.0.1:")
        assert record["wrong_token"] == "UNAUTHENTICATED"
        assert "NNI_STUDY_STORAGE_TOKEN" not in record["environ"]  # the runner took it out of the objective's sight
        shown = json.dumps([record["environ"], record["argv"]])
        assert "study.db" not in shown and "sqlite" not in shown


def test_tpe_study_through_the_agent(study_dir: Path) -> None:
    result, trials = run_study(study_dir, "objectives.py:quadratic", 5, "--sampler", "TPESampler",
                               "--direction", "minimize")
    assert "maxTrialNumber (5) reached" in result.stdout
    assert sorted(t.number for t in trials) == [0, 1, 2, 3, 4]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert all(t.user_attrs == {"note": "hello"} for t in trials)
    records = check_each_saw_its_trial(study_dir, trials)
    check_only_the_agent(study_dir, records)
    assert set(nni_trials(study_dir).values()) == {TrialJobStatus.SUCCEEDED}


def test_median_pruner_prunes_and_the_trial_ends_early_stopped(study_dir: Path) -> None:
    _, trials = run_study(study_dir, "objectives.py:steps", 7, "--sampler", "RandomSampler", "--pruner",
                          "MedianPruner", concurrency=1)
    states = {t.number: t.state for t in trials}
    assert states == {**{n: optuna.trial.TrialState.COMPLETE for n in range(5)},
                      5: optuna.trial.TrialState.PRUNED, 6: optuna.trial.TrialState.PRUNED}
    records = check_each_saw_its_trial(study_dir, trials)
    statuses = nni_trials(study_dir)
    for t in trials:
        trial_id = t.system_attrs["nni:trial_id"]
        if t.state == optuna.trial.TrialState.PRUNED:
            assert statuses[trial_id] == TrialJobStatus.EARLY_STOPPED
            assert records[trial_id]["pruned_at"] == 0 == t.last_step  # the step the pruner chose
        else:
            assert statuses[trial_id] == TrialJobStatus.SUCCEEDED and t.last_step == 2


def test_an_objective_that_raises_fails_here_and_in_the_study(study_dir: Path) -> None:
    _, trials = run_study(study_dir, "objectives.py:broken", 2)
    assert len(trials) == 2 and all(t.state == optuna.trial.TrialState.FAIL for t in trials)
    check_each_saw_its_trial(study_dir, trials)
    assert set(nni_trials(study_dir).values()) == {TrialJobStatus.FAILED}
    (exp_dir,) = (study_dir / "exps").iterdir()
    stderr = "".join(p.read_text() for p in exp_dir.glob("trials/*/trial.stderr"))
    assert stderr.count("ValueError: the objective broke on purpose") == 2


def test_nsga2_two_objectives(study_dir: Path) -> None:
    _, trials = run_study(study_dir, "objectives.py:two_objectives", 4, "--sampler", "NSGAIISampler",
                          "--direction", "minimize", "--direction", "maximize")
    assert len(trials) == 4 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert all(len(t.values) == 2 for t in trials)
    check_each_saw_its_trial(study_dir, trials)
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{study_dir / 'db' / 'study.db'}")
    assert study.directions == [optuna.study.StudyDirection.MINIMIZE, optuna.study.StudyDirection.MAXIMIZE]
    assert study.best_trials


def test_cmaes_sampler(study_dir: Path) -> None:
    """CmaEsSampler (it needs the `cmaes` package in the trial's Python): after its one start-up
    trial every trial's params are CMA-ES's, sampled in the trial's process from the study's history."""
    _, trials = run_study(study_dir, "objectives.py:bowl", 4, "--sampler", "CmaEsSampler", concurrency=1)
    assert len(trials) == 4 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    check_each_saw_its_trial(study_dir, trials)
    by_number = sorted(trials, key=lambda t: t.number)
    assert "cma:generation" not in by_number[0].system_attrs  # the start-up trial: independent sampling
    assert all("cma:generation" in t.system_attrs for t in by_number[1:]), [t.system_attrs for t in by_number]


def test_hyperband_pruner_prunes_at_the_step_it_chose(study_dir: Path) -> None:
    """HyperbandPruner: each pruned trial is PRUNED at the step where its objective was told to stop,
    with the intermediate values the objective reported, and ends EARLY_STOPPED here."""
    _, trials = run_study(study_dir, "objectives.py:nine_steps", 8, "--sampler", "RandomSampler", "--pruner",
                          "HyperbandPruner", concurrency=1)
    assert len(trials) == 8 and all(t.state.is_finished() for t in trials)
    records = check_each_saw_its_trial(study_dir, trials)
    statuses = nni_trials(study_dir)
    pruned = [t for t in trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned and len(pruned) < len(trials), [(t.number, t.state) for t in trials]
    for t in trials:
        record = records[t.system_attrs["nni:trial_id"]]
        assert {int(k): v for k, v in record["reported"].items()} == t.intermediate_values
        if t.state == optuna.trial.TrialState.PRUNED:
            assert record["pruned_at"] == t.last_step < 8
            assert statuses[t.system_attrs["nni:trial_id"]] == TrialJobStatus.EARLY_STOPPED
        else:
            assert t.state == optuna.trial.TrialState.COMPLETE and t.last_step == 8 and "pruned_at" not in record


@pytest.mark.parametrize("kill_signal", ["SIGINT", "SIGKILL"])
def test_a_trial_stopped_mid_way_leaves_no_running_optuna_trial(study_dir: Path, kill_signal: str) -> None:
    """maxTrialDuration stops the objectives mid-trial: on SIGINT the runner tells the study FAIL; a
    SIGKILLed runner cannot, and the manager marks its Optuna trial FAIL when the trial ends."""
    _, trials = run_study(study_dir, "objectives.py:sleeper", 2,
                          config_extra=f"maxTrialDuration: 10s\ntrialKillSignal: {kill_signal}\n")
    assert len(trials) == 2 and all(t.state == optuna.trial.TrialState.FAIL for t in trials)
    check_each_saw_its_trial(study_dir, trials)
    assert set(nni_trials(study_dir).values()) == {TrialJobStatus.EARLY_STOPPED}
    (exp_dir,) = (study_dir / "exps").iterdir()
    marked = (exp_dir / "log" / "nnimanager.log").read_text().count("was left RUNNING: marked FAIL")
    assert marked == (2 if kill_signal == "SIGKILL" else 0)


def optuna_cli(where: Path, *args: str, env: dict | None = None,
               target: str = "objectives.py:quadratic") -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "optuna", target, "--study-name", "s", "--storage",
                           f"sqlite:///{where / 'study.db'}", "--config", str(where / "config.yml"), *args],
                          cwd=where, capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("args, config, words", [
    (["--n-trials", "2", "--sampler", "Tpe"], "", "`--sampler`: 'Tpe' is not one of Optuna's samplers"),
    (["--n-trials", "0"], "", "`--n-trials`: 0 is not a positive number"),
    (["--n-trials", "2"], "tuner:\n  name: TPE\n", "`tuner`: is given by `nni-manager optuna`"),
    (["--n-trials", "2"], "searchSpace: {}\n", "`searchSpace`: is given by `nni-manager optuna`"),
    (["--n-trials", "2"], "maxTrialNumber: 5\n", "`maxTrialNumber`: differs from --n-trials 2"),
])
def test_wrong_arguments_are_one_line_and_start_nothing(study_dir: Path, args: list, config: str, words: str) -> None:
    path = study_dir / "config.yml"
    path.write_text(path.read_text().replace("{concurrency}", "1") + config)
    result = optuna_cli(study_dir, *args)
    assert result.returncode == 2 and words in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (study_dir / "exps").exists() and not (study_dir / "study.db").exists()


def test_a_target_file_not_in_the_code_directory_is_one_line(study_dir: Path) -> None:
    path = study_dir / "config.yml"
    path.write_text(path.read_text().replace("{concurrency}", "1"))
    result = optuna_cli(study_dir, "--n-trials", "2", target="missing.py:objective")
    assert result.returncode == 2, result.stderr
    assert "`TARGET`: missing.py is not a file in trialCodeDirectory" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (study_dir / "exps").exists()


def test_without_optuna_the_command_says_how_to_get_it(study_dir: Path, tmp_path: Path) -> None:
    """A manager without optuna installed: one line naming `pip install optuna` (the package hidden)."""
    hidden = tmp_path / "hide"
    (hidden / "optuna").mkdir(parents=True)
    (hidden / "optuna" / "__init__.py").write_text("raise ImportError('No module named optuna')\n")
    path = study_dir / "config.yml"
    path.write_text(path.read_text().replace("{concurrency}", "1"))
    result = optuna_cli(study_dir, "--n-trials", "2", env={**os.environ, "PYTHONPATH": str(hidden)})
    assert result.returncode == 2 and "`pip install optuna`" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_detached_study_is_an_ordinary_experiment(study_dir: Path, tmp_path: Path) -> None:
    """--detach, then `list`, `trials`, `logs` and `stop` as for any experiment; the stop leaves no
    Optuna trial RUNNING."""
    env = {**os.environ, "HOME": str(tmp_path)}
    path = study_dir / "config.yml"
    path.write_text(path.read_text().replace("{concurrency}", "1"))
    storage = f"sqlite:///{study_dir / 'study.db'}"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], cwd=study_dir, capture_output=True, text=True, timeout=120, env=env)

    env["NNI_MANAGER_STUDY_STORAGE"] = storage  # the URL (a password in it) stays out of every process list
    started = cli("optuna", "objectives.py:slow", "--study-name", "s", "--n-trials", "50",
                  "--config", str(path), "--detach", "--port", "0")
    del env["NNI_MANAGER_STUDY_STORAGE"]
    assert started.returncode == 0, started.stderr
    experiment_id = started.stdout.split()[1]
    pid = int(re.search(r"\(pid (\d+)\)", started.stdout).group(1))
    try:
        assert b"study.db" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        listed = cli("list")
        assert experiment_id in listed.stdout and "optuna s" in listed.stdout, listed.stdout
        deadline = time.monotonic() + 60
        while len(seen(study_dir)) < 2:
            assert time.monotonic() < deadline, "no trial ran"
            time.sleep(0.2)
    finally:
        stopped = cli("stop", experiment_id)
    assert stopped.returncode == 0, stopped.stderr
    trials = optuna.load_study(study_name="s", storage=storage).get_trials(deepcopy=False)
    assert trials and not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    check_only_the_agent(study_dir, seen(study_dir))  # the URL from the environment never reached a trial
    table = cli("trials", experiment_id)
    assert table.returncode == 0 and "SUCCEEDED" in table.stdout, table.stdout + table.stderr
    done = next(t for t in trials if t.state == optuna.trial.TrialState.COMPLETE)
    logs = cli("logs", experiment_id, done.system_attrs["nni:trial_id"])
    assert f"Optuna trial {done.number}: COMPLETE" in logs.stdout, logs.stdout + logs.stderr
    resumed = cli("resume", experiment_id)  # not built yet: said in one line, nothing started
    assert resumed.returncode == 2 and "ran an Optuna study, which cannot be resumed yet" in resumed.stderr


def test_python_api_optimize_runs_the_study(study_dir: Path) -> None:
    """`optimize(study, TARGET, n_trials=N, config=...)` from Python: returns when the N trials are done."""
    from nni_manager.optuna import optimize

    study = optuna.create_study(storage=f"sqlite:///{study_dir / 'api.db'}", study_name="api",
                                sampler=optuna.samplers.RandomSampler(), direction="maximize")
    config = {"trialCodeDirectory": str(study_dir / "code"), "trialConcurrency": 2,
              "experimentWorkingDirectory": str(study_dir / "exps"), "trainingService": {"platform": "local"}}
    result = optimize(study, "objectives.py:quadratic", n_trials=3, config=config)
    assert result.stop_reason == "maxTrialNumber (3) reached" and result.optimize_mode == "maximize"
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 3 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    check_each_saw_its_trial(study_dir, trials)
    assert result.best is not None and result.best.metric == study.best_value


def test_a_storage_password_never_reaches_an_error_line() -> None:
    from nni_manager.optuna.storage import redact_url

    url = "postgresql://alice:p%40ss w0rd@db.example/study"  # not dialed
    assert redact_url(url, f"cannot parse {url} (password p@ss w0rd)") == (
        "cannot parse postgresql://alice:***@db.example/study (password ***)")  # not dialed
