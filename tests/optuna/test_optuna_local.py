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
import signal
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


def nni_records(where: Path) -> dict[str, dict]:
    """Each trial's parameter record as the experiment keeps it (form and parameters table alike)."""
    (exp_dir,) = (where / "exps").iterdir()
    store = Store.open_readonly(exp_dir)
    try:
        records = {}
        for t in store.trials():
            records[t.id] = json.loads(t.form.hyper_parameters.value)
            assert [json.loads(v) for _, v in store.parameters(t.id)] == [records[t.id]]  # what the WebUI reads
        return records
    finally:
        store.close()


def seen(where: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (where / "code" / "seen").glob("*.json")}


def check_each_saw_its_trial(where: Path, trials: list) -> dict[str, dict]:
    """Every Optuna trial is one NNI trial's, with the params and values its objective saw and returned."""
    records = seen(where)
    statuses = nni_trials(where)
    finals = nni_finals(where)
    kept = nni_records(where)
    assert len(records) == len(trials) == len(statuses)
    for t in trials:
        trial_id = t.user_attrs["nni:trial_id"]
        record = records[trial_id]
        assert record["number"] == t.number and record["params"] == t.params
        assert kept[trial_id]["parameters"] == t.params  # `trials`, the WebUI and export show the study's params
        assert kept[trial_id]["optuna"] == {"number": t.number, "state": t.state.name, "params": t.params,
                                            "values": t.values}
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
    records = check_each_saw_its_trial(study_dir, trials)
    (exp_dir,) = (study_dir / "exps").iterdir()
    for t in trials:  # the manager made each with the NNI ids as user attrs: the objective saw them too
        trial_id = t.user_attrs["nni:trial_id"]
        assert t.user_attrs == {"note": "hello", "nni:experiment_id": exp_dir.name, "nni:trial_id": trial_id}
        assert records[trial_id]["user_attrs"] == {"nni:experiment_id": exp_dir.name, "nni:trial_id": trial_id}
        assert records[trial_id]["environ"]["NNI_TRIAL_JOB_ID"] == trial_id
    check_only_the_agent(study_dir, records)
    assert set(nni_trials(study_dir).values()) == {TrialJobStatus.SUCCEEDED}
    table = subprocess.run([*CLI, "trials", str(exp_dir)], capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    for t in trials:
        (row,) = [line for line in table.stdout.splitlines() if t.user_attrs["nni:trial_id"] in line]
        assert f"optuna_trial={t.number}, x={t.params['x']:.4g}, n={t.params['n']}, kind={t.params['kind']}" in row
        assert f" {t.value:.4g} " in row, row
    # the WebUI's REST API (what its trial detail and export read) gives the same params
    from tests.support.webui.fixtures import get_json

    view = subprocess.Popen([*CLI, "view", str(exp_dir), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert view.stdout is not None
        url = re.match(r"WebUI: (\S+)", view.stdout.readline()).group(1)  # type: ignore[union-attr]
        jobs = get_json(url + "api/v1/nni/trial-jobs")
    finally:
        view.terminate()
        view.wait(30)
    shown = {j["trialJobId"]: json.loads(j["hyperParameters"][0]) for j in jobs}
    for t in trials:
        record = shown[t.user_attrs["nni:trial_id"]]
        assert record["parameters"] == t.params, record  # (NNI's client takes only its own keys: no "optuna")


def test_an_enqueued_trial_is_run_and_tagged(study_dir: Path) -> None:
    """`study.enqueue_trial` before the run: a trial's `study.ask()` takes the WAITING trial (no new
    one is created); the manager tags it with the NNI ids as it tags the trials it creates."""
    (study_dir / "db").mkdir()
    study = optuna.create_study(storage=f"sqlite:///{study_dir / 'db' / 'study.db'}", study_name="s")
    study.enqueue_trial({"x": 1.5, "n": 2, "kind": "b"})
    _, trials = run_study(study_dir, "objectives.py:quadratic", 2, concurrency=1)
    records = check_each_saw_its_trial(study_dir, trials)
    (exp_dir,) = (study_dir / "exps").iterdir()
    first, second = sorted(trials, key=lambda t: t.number)
    assert first.params == {"x": 1.5, "n": 2, "kind": "b"} and first.state == optuna.trial.TrialState.COMPLETE
    assert second.state == optuna.trial.TrialState.COMPLETE
    for t in trials:
        assert t.user_attrs["nni:experiment_id"] == exp_dir.name
        assert records[t.user_attrs["nni:trial_id"]]["number"] == t.number


def test_median_pruner_prunes_and_the_trial_ends_early_stopped(study_dir: Path) -> None:
    _, trials = run_study(study_dir, "objectives.py:steps", 7, "--sampler", "RandomSampler", "--pruner",
                          "MedianPruner", concurrency=1)
    states = {t.number: t.state for t in trials}
    assert states == {**{n: optuna.trial.TrialState.COMPLETE for n in range(5)},
                      5: optuna.trial.TrialState.PRUNED, 6: optuna.trial.TrialState.PRUNED}
    records = check_each_saw_its_trial(study_dir, trials)
    statuses = nni_trials(study_dir)
    for t in trials:
        trial_id = t.user_attrs["nni:trial_id"]
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


def test_an_objective_that_cannot_be_loaded_is_a_fail_trial(study_dir: Path) -> None:
    """The runner creates its Optuna trial before loading the objective: a function the file lacks is
    one FAIL trial (counted in n_trials, as an objective that raises), the reason on the trial's stderr."""
    _, trials = run_study(study_dir, "objectives.py:no_such_function", 1)
    assert [t.state for t in trials] == [optuna.trial.TrialState.FAIL]
    assert set(nni_trials(study_dir).values()) == {TrialJobStatus.FAILED}
    (exp_dir,) = (study_dir / "exps").iterdir()
    stderr = "".join(p.read_text() for p in exp_dir.glob("trials/*/trial.stderr"))
    assert "cannot load the objective: TARGET 'objectives.py:no_such_function'" in stderr, stderr


def test_nsga2_two_objectives(study_dir: Path) -> None:
    _, trials = run_study(study_dir, "objectives.py:two_objectives", 4, "--sampler", "NSGAIISampler",
                          "--direction", "minimize", "--direction", "maximize")
    assert len(trials) == 4 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert all(len(t.values) == 2 for t in trials)
    check_each_saw_its_trial(study_dir, trials)
    (exp_dir,) = (study_dir / "exps").iterdir()
    table = subprocess.run([*CLI, "trials", str(exp_dir)], capture_output=True, text=True, timeout=60)
    for t in trials:  # both values of each trial in the final column
        (row,) = [line for line in table.stdout.splitlines() if t.user_attrs["nni:trial_id"] in line]
        assert f"[{t.values[0]:.4g}, {t.values[1]:.4g}]" in row, row
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
        record = records[t.user_attrs["nni:trial_id"]]
        assert {int(k): v for k, v in record["reported"].items()} == t.intermediate_values
        if t.state == optuna.trial.TrialState.PRUNED:
            assert record["pruned_at"] == t.last_step < 8
            assert statuses[t.user_attrs["nni:trial_id"]] == TrialJobStatus.EARLY_STOPPED
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


def start_study(where: Path, target: str, n_trials: int, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`nni-manager optuna` in the background (concurrency 1); the storage URL."""
    config = where / "config.yml"
    config.write_text(config.read_text().replace("{concurrency}", "1"))
    storage = f"sqlite:///{where / 'study.db'}"
    proc = subprocess.Popen([*CLI, "optuna", target, "--study-name", "s", "--storage", storage, "--n-trials",
                             str(n_trials), "--config", str(config), "--plain", "--no-webui"], cwd=where,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    return proc, storage


def wait_for(what, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)
    return found


def test_a_worker_killed_mid_trial_leaves_its_optuna_trial_fail(study_dir: Path) -> None:
    """The trial's process SIGKILLed from outside (not by the agent) while its objective runs: the
    NNI trial ends FAILED, its Optuna trial FAIL (the runner could not say it: the manager did), and
    it counts: the study ends with exactly n_trials finished trials."""
    proc, storage = start_study(study_dir, "objectives.py:first_hangs", 2)
    try:
        hanging = wait_for(lambda: [r for r in seen(study_dir).values() if r["hangs"]])
        os.kill(hanging[0]["pid"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    trials = optuna.load_study(study_name="s", storage=storage).get_trials(deepcopy=False)
    assert sorted((t.number, t.state.name) for t in trials) == [(0, "FAIL"), (1, "COMPLETE")]
    statuses = nni_trials(study_dir)
    assert statuses[hanging[0]["environ"]["NNI_TRIAL_JOB_ID"]] == TrialJobStatus.FAILED and len(statuses) == 2
    (exp_dir,) = (study_dir / "exps").iterdir()
    assert "was left RUNNING: marked FAIL" in (exp_dir / "log" / "nnimanager.log").read_text()


def test_a_runner_killed_before_ask_is_replaced(study_dir: Path, tmp_path: Path) -> None:
    """The first trial's runner is SIGKILLed before it created its Optuna trial (held at interpreter
    start by a sitecustomize): it does not count, another trial takes its place, and the study
    holds exactly n_trials finished trials."""
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "sitecustomize.py").write_text(
        "import os, sys, time\n"
        "if sys.argv[:1] == ['-m'] and os.environ.get('NNI_STUDY_STORAGE'):\n"
        "    mark = os.path.join(%r, 'held')\n"
        "    if not os.path.exists(mark):\n"
        "        open(mark, 'w').write(str(os.getpid()))\n"
        "        time.sleep(120)\n" % str(hold))
    env = {**os.environ, "PYTHONPATH": str(hold)}
    proc, storage = start_study(study_dir, "objectives.py:quadratic", 2, env=env)
    try:
        pid = int(wait_for(lambda: (hold / "held").exists() and (hold / "held").read_text()))
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    trials = optuna.load_study(study_name="s", storage=storage).get_trials(deepcopy=False)
    (exp_dir,) = (study_dir / "exps").iterdir()
    assert len(trials) == 2 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials), (
        out + (exp_dir / "log" / "nnimanager.log").read_text())
    statuses = nni_trials(study_dir)
    assert sorted(s.value for s in statuses.values()) == ["FAILED", "SUCCEEDED", "SUCCEEDED"], statuses
    assert "maxTrialNumber (2) reached" in out


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_optuna_and_its_dashboard_see_the_study_while_it_runs(study_dir: Path) -> None:
    """Optuna's own API (optuna.load_study on the same SQLite) and optuna-dashboard's app (its JSON
    API on loopback) show trials COMPLETE appear while the experiment is still running."""
    import urllib.request

    # the study (as `nni-manager optuna` makes it: load_if_exists) and the dashboard first, answering,
    # so that a slow start of either on a loaded machine cannot hide the study while it runs
    storage = f"sqlite:///{study_dir / 'study.db'}"
    optuna.create_study(storage=storage, study_name="s")
    port = free_port()
    dashboard = subprocess.Popen([str(Path(sys.executable).parent / "optuna-dashboard"), storage, "--host",
                                  "127.0.0.1", "--port", str(port), "--quiet"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def dashboard_states() -> list[str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=10) as r:
            (study,) = [s for s in json.load(r)["study_summaries"] if s["study_name"] == "s"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{study['study_id']}", timeout=10) as r:
            return [t["state"] for t in json.load(r)["trials"]]

    def answering() -> bool:
        try:
            return dashboard_states() == []
        except (ValueError, OSError):
            return False

    try:
        wait_for(answering, 120)
    except BaseException:
        dashboard.kill()
        raise
    proc, started_storage = start_study(study_dir, "objectives.py:slow", 4)
    assert started_storage == storage

    seen_by_optuna: set[int] = set()  # how many COMPLETE, observed while the experiment ran
    seen_by_dashboard: set[int] = set()
    try:
        while proc.poll() is None:
            try:
                trials = optuna.load_study(study_name="s", storage=storage).get_trials(deepcopy=False)
                states = dashboard_states()
            except (KeyError, ValueError, OSError):  # the study or the dashboard not there yet
                time.sleep(0.2)
                continue
            if proc.poll() is None:
                seen_by_optuna.add(sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials))
                seen_by_dashboard.add(states.count("Complete"))
            time.sleep(0.2)
        out = proc.communicate(timeout=60)[0]
        assert proc.returncode == 0, out
        assert [t.state.name for t in optuna.load_study(study_name="s", storage=storage).trials] == ["COMPLETE"] * 4
        # the dashboard keeps a study's trials for a few seconds (its in-memory cache's TTL): it follows
        wait_for(lambda: dashboard_states() == ["Complete"] * 4, 30)
        # each trial names its NNI experiment and trial there, as user attrs (`nni-manager logs EXP TRIAL`)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=10) as r:
            (study,) = [s for s in json.load(r)["study_summaries"] if s["study_name"] == "s"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{study['study_id']}", timeout=10) as r:
            shown = [{a["key"]: a["value"] for a in t["user_attrs"]} for t in json.load(r)["trials"]]
        (exp_dir,) = (study_dir / "exps").iterdir()
        assert {s["nni:experiment_id"] for s in shown} == {exp_dir.name}, shown
        assert {s["nni:trial_id"] for s in shown} == set(nni_trials(study_dir)), shown
    finally:
        proc.kill()
        dashboard.terminate()
        dashboard.wait(timeout=30)
    assert seen_by_optuna & {1, 2, 3}, seen_by_optuna  # some COMPLETE, not all, before the end
    assert seen_by_dashboard & {1, 2, 3}, seen_by_dashboard


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


@pytest.mark.parametrize("platform, roles", [
    ("kubeflow", "  operator: tf-operator\n  apiVersion: v1\n  worker:\n    replicas: 1\n    command: python3 t.py\n"
                 "    image: python:3.11\n    cpuNumber: 1\n    memorySize: 1gb\n"),
    ("frameworkcontroller", "  taskRoles:\n    - name: worker\n      taskNumber: 1\n      command: python3 t.py\n"
                            "      image: python:3.11\n      cpuNumber: 1\n      memorySize: 1gb\n"),
])
def test_role_platforms_are_refused_in_one_line(study_dir: Path, platform: str, roles: str) -> None:
    """kubeflow and frameworkcontroller run each role's own `command`: a study's trial is one command
    (the runner), so the command refuses them at start, naming the field and the platform to use."""
    path = study_dir / "config.yml"
    path.write_text("trialCodeDirectory: code\ntrialConcurrency: 1\nexperimentWorkingDirectory: exps\n"
                    f"trainingService:\n  platform: {platform}\n{roles}")
    result = optuna_cli(study_dir, "--n-trials", "2")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == (
        f"nni-manager: config field `trainingService.platform`: {platform} runs each role's own `command`, and a "
        "study's trial is one command (the runner of one Optuna trial). Fix: use `platform: kubernetes` (one pod per "
        "trial, on the same cluster)"), result.stderr
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


@pytest.mark.slow
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
    started = cli("optuna", "objectives.py:slow", "--study-name", "s", "--n-trials", "6",
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
    logs = cli("logs", experiment_id, done.user_attrs["nni:trial_id"])
    assert f"Optuna trial {done.number}: COMPLETE" in logs.stdout, logs.stdout + logs.stderr
    assert len(trials) < 6
    # resume: the same study (URL kept: it holds no password) runs on to 6 finished trials of this experiment
    resumed = cli("resume", experiment_id, "--plain", "--no-webui")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "maxTrialNumber (6) reached" in resumed.stdout
    after = optuna.load_study(study_name="s", storage=storage).get_trials(deepcopy=False)
    assert len(after) == 6 and all(t.state.is_finished() for t in after)
    assert {t.user_attrs["nni:experiment_id"] for t in after} == {experiment_id}
    assert [t.state for t in after[:len(trials)]] == [t.state for t in trials]  # the first run's stay as they were
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in after[len(trials):])
    statuses = nni_trials(study_dir)
    assert {t.user_attrs["nni:trial_id"] for t in after} <= set(statuses)


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


@pytest.mark.parametrize("status, message, counts", [
    ("FAILED", "exit code 1: the trial's Python has no optuna", True),  # every replacement would say the same
    ("FAILED", "exit code 2: nni_agent.study_runner: NNI_STUDY_STORAGE is not set", True),
    ("FAILED", "exit code 137: Killed", False),  # SIGKILL through the trial's shell
    ("FAILED", "killed by signal SIGKILL", False),
    ("USER_CANCELED", "", False),
    ("SYS_CANCELED", "the agent was lost", False),
])
def test_which_trials_without_an_optuna_trial_count(status: str, message: str, counts: bool) -> None:
    from nni_manager.optuna.study import counts_without_optuna_trial

    assert counts_without_optuna_trial(status, message) is counts


def test_resume_asks_for_a_storage_url_with_a_password_again(tmp_path: Path) -> None:
    """The experiment keeps its study's command line for `resume`, but not a URL with a password:
    `resume` then says in one line to set NNI_MANAGER_STUDY_STORAGE, and starts nothing."""
    from nni_manager.optuna.study import StudySpec, save_spec, saved_spec

    exp_dir = tmp_path / "exps" / "pwexp"
    store = Store.open(exp_dir)
    try:
        store.init_experiment("pwexp", {}, 0)
        url = "postgresql://alice:s3cret@db.example/study"  # not dialed
        save_spec(store, StudySpec("objectives.py:quadratic", "s", url, 3, ["minimize"]), str(tmp_path / "c.yml"))
        assert saved_spec(store) == {"target": "objectives.py:quadratic", "study_name": "s", "n_trials": 3,
                                     "directions": ["minimize"], "sampler": None, "pruner": None, "storage": "",
                                     "config": str(tmp_path / "c.yml")}
    finally:
        store.close()
    assert not [p for p in exp_dir.iterdir() if b"s3cret" in p.read_bytes()]  # the database and its WAL
    env = {k: v for k, v in os.environ.items() if k != "NNI_MANAGER_STUDY_STORAGE"}
    result = subprocess.run([*CLI, "resume", str(exp_dir)], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == ("nni-manager: experiment pwexp's study storage URL holds a password, which is "
                                     "not kept: set NNI_MANAGER_STUDY_STORAGE to the URL and resume again")
