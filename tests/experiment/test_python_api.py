"""NNI 3.0's Python experiment API by changing one import (`from nni_manager import Experiment`):
NNI's own notebook, and each of NNI's `Experiment` methods against what NNI 3.0 documents
(nni/experiment/experiment.py and data.py: signatures, return shapes, REST calls)."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

NNI_MISSING = "" if importlib.util.find_spec("nni") else "the real nni package is not installed; pip install nni==3.0"
pytestmark = pytest.mark.skipif(bool(NNI_MISSING), reason=NNI_MISSING or "-")

EXAMPLE = Path(__file__).parent / "nni_configs" / "examples" / "trials" / "sklearn" / "classification"
NNI_IMPORT = "from nni.experiment import Experiment"
OUR_IMPORT = "from nni_manager import Experiment"
NOISE = ("Task was destroyed but it is pending", "Event loop is closed", "Traceback", "Exception ignored")

# Runs the notebook's code cells in order, as Jupyter would (the last expression's value is the
# cell's output), with checks between cells; prints one JSON report on its last line.
HARNESS = r'''
import ast, json, subprocess, sys, time, urllib.request
from pathlib import Path

cells = json.loads(Path("cells.json").read_text())
ns = {"__name__": "__main__"}
report = {"outputs": []}

def run_cell(src):
    tree = ast.parse(src)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), ns)
    return None if last is None else eval(compile(ast.Expression(last.value), "<cell>", "eval"), ns)

for src in cells:
    if "export_data()" in src:  # a person reads the WebUI a while before asking for results
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and sum(
                j.status == "SUCCEEDED" for j in ns["experiment"].list_trial_jobs()) < 2:
            time.sleep(0.5)
    out = run_cell(src)
    report["outputs"].append(repr(out))
    if "experiment.start(" in src:
        e = ns["experiment"]
        report["id"], report["port"] = e.id, e.port
        with urllib.request.urlopen(f"http://127.0.0.1:{e.port}/", timeout=20) as r:
            report["webui"] = r.read().decode(errors="replace")[:2000]
        report["list"] = subprocess.run(["nni-manager", "list"], capture_output=True, text=True).stdout
        # the manifest follows the experiment's status within a second or so (a loaded machine: longer);
        # NNI's statuses of a live experiment (running, or every trial submitted and some still running),
        # or DONE: an idle machine runs the notebook's 10 trials in half a minute
        SEEN = ("RUNNING", "NO_MORE_TRIAL", "TUNER_NO_MORE_TRIAL", "DONE")
        deadline = time.monotonic() + 60
        while True:
            report["nnictl"] = subprocess.run(["nnictl", "experiment", "list"], capture_output=True, text=True).stdout
            if any(f"Status: {s}" in report["nnictl"] for s in SEEN) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    if "export_data()" in src:
        report["export"] = [[sorted(r.parameter), r.value, r.trialJobId] for r in out]
    if "get_status()" in src:  # what the trials were when it answered
        report["trials_at_status"] = [j.status for j in ns["experiment"].list_trial_jobs()]
    if "get_job_metrics()" in src:
        report["metrics"] = {k: [[m.type, m.data, m.trialJobId] for m in v] for k, v in out.items()}
report["after_stop"] = subprocess.run(["nni-manager", "list"], capture_output=True, text=True).stdout
print(json.dumps(report))
'''


def _cells(notebook: Path) -> list[str]:
    """The notebook's code cells with only NNI's import changed."""
    cells = ["".join(c["source"]) for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    changed = [c.replace(NNI_IMPORT, OUR_IMPORT) for c in cells]
    assert sum(NNI_IMPORT in c for c in cells) == 1 and "nni.experiment" not in "".join(changed)
    return changed


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(home), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.slow
def test_nni_python_api_start_notebook_runs_with_one_import_changed(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    work = tmp_path / "classification"
    shutil.copytree(EXAMPLE, work)
    (work / "main.py.txt").rename(work / "main.py")  # NNI's trial code, byte for byte
    (work / "cells.json").write_text(json.dumps(_cells(work / "python_api_start.ipynb")))
    (work / "harness.py").write_text(HARNESS)
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.run([sys.executable, "harness.py"], cwd=work, env=_env(home), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for noise in NOISE:
        assert noise not in proc.stderr, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    exp_id = report["id"]
    assert "<html" in report["webui"].lower() and "<script" in report["webui"].lower()  # NNI's WebUI itself
    assert exp_id in report["list"] and "RUNNING" in report["list"]
    assert f"Id: {exp_id}" in report["nnictl"], report["nnictl"]
    assert any(f"Status: {s}" in report["nnictl"] for s in ("RUNNING", "NO_MORE_TRIAL", "TUNER_NO_MORE_TRIAL", "DONE")), \
        report["nnictl"]
    assert exp_id not in report["after_stop"]  # stop() stopped it: no longer running
    status, trials = report["outputs"][3].strip("'"), report["trials_at_status"]  # the get_status() cell
    if status == "DONE":  # an idle machine runs the 10 trials before the cell: then all have ended
        assert len(trials) == 10 and not {"WAITING", "RUNNING"} & set(trials), trials
    else:
        assert status in ("RUNNING", "NO_MORE_TRIAL", "TUNER_NO_MORE_TRIAL"), status
    export = report["export"]
    assert len(export) >= 2
    for keys, value, _trial in export:  # an SVC's accuracy on the digits, as in the notebook's output
        assert keys == ["C", "coef0", "degree", "gamma", "kernel"] and 0 < value <= 1
    metrics = report["metrics"]
    for _keys, value, trial in export:
        assert [m[0] for m in metrics[trial]] == ["FINAL"] and metrics[trial][0][1] == value
    entry = json.loads((home / "nni-experiments" / ".experiment").read_text())[exp_id]
    assert entry["status"] == "STOPPED" and entry["platform"] == "local" and entry["experimentName"] == "Example"


# -- each method NNI 3.0 has, against NNI's documented behaviour ---------------------------------

TRIAL = """
import time
import nni
p = nni.get_next_parameter()
print("trial prints", p["x"])
for step in range(3):
    nni.report_intermediate_result(p["x"] * (step + 1))
    time.sleep(p.get("pause", 0))
nni.report_final_result(p["x"])
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """NNI's manifest (~/nni-experiments/.experiment) of this test only."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def _config(tmp_path: Path, **fields: Any) -> Any:
    from nni.experiment import ExperimentConfig

    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(textwrap.dedent(TRIAL))
    config = ExperimentConfig("local")
    config.experiment_name = "api-test"
    config.trial_command = "python trial.py"
    config.trial_code_directory = str(code)
    config.trial_concurrency = 2
    config.max_trial_number = 2
    config.search_space = {"x": {"_type": "choice", "_value": [1, 2]}, "pause": {"_type": "choice", "_value": [0]}}
    config.tuner.name = "GridSearch"
    config.experiment_working_directory = str(tmp_path / "exps")
    for key, value in fields.items():
        setattr(config, key, value)
    return config


def _stopped(experiment: Any) -> bool:
    """STOPPED, or gone: its server ends before `port` is cleared, and a look in between finds no
    one answering (then wait for the port to clear)."""
    if experiment.port is None:
        return True
    try:
        return bool(experiment.get_status() == "STOPPED")
    except RuntimeError as e:
        assert "no experiment answers" in str(e), e
        return False


def _wait(predicate: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_run_queries_and_checkpoints(tmp_path: Path, home: Path) -> None:
    from nni_manager import Experiment

    experiment = Experiment(_config(tmp_path), "apitest1")
    assert experiment.has_checkpoint() is False
    assert experiment.run(port=0) is True  # NNI: True once DONE; the manager stays up until stop()
    try:
        assert experiment.get_status() == "DONE"
        jobs = experiment.list_trial_jobs()
        assert sorted(j.hyperParameters[0].parameters["x"] for j in jobs) == [1, 2]
        job = experiment.get_trial_job(jobs[0].trialJobId)  # get_trial_job: one TrialJob
        assert job.trialJobId == jobs[0].trialJobId and job.status == "SUCCEEDED"
        assert [m.data for m in job.finalMetricData] == [job.hyperParameters[0].parameters["x"]]
        metrics = experiment.get_job_metrics()  # trial id -> [TrialMetricData], intermediate then final
        assert set(metrics) == {j.trialJobId for j in jobs}
        for j in jobs:
            x = j.hyperParameters[0].parameters["x"]
            assert [(m.type, m.data) for m in metrics[j.trialJobId]] == [
                ("PERIODICAL", x), ("PERIODICAL", 2 * x), ("PERIODICAL", 3 * x), ("FINAL", x)]
        assert experiment.get_job_metrics(jobs[0].trialJobId).keys() == {jobs[0].trialJobId}
        profile = experiment.get_experiment_profile()  # NNI's profile: id, params, logDir, ...
        assert profile["id"] == "apitest1" and profile["params"]["maxTrialNumber"] == 2
        assert profile["params"]["experimentName"] == "api-test"
        meta = experiment.get_experiment_metadata("apitest1")  # its ~/nni-experiments/.experiment entry
        assert meta["port"] == experiment.port and meta["pid"] == os.getpid() and meta["status"] == "DONE"
        assert experiment.get_experiment_metadata("nosuchid") == {}
        assert any(m["id"] == "apitest1" for m in experiment.get_all_experiments_metadata())
        assert experiment.has_checkpoint() is True
        assert experiment.save_checkpoint() is None  # NNI's is a no-op for HPO experiments too
    finally:
        experiment.stop()
    assert experiment.port is None and experiment.get_status() == "DONE"
    with pytest.raises(RuntimeError, match="not running"):
        experiment.list_trial_jobs()

    # load_checkpoint: a fresh Experiment(None, id) gets the stored config
    stored = Experiment(None, "apitest1")
    stored.load_checkpoint()
    assert stored.config.max_trial_number == 2 and stored.config.experiment_name == "api-test"

    # view(): the stored experiment's WebUI, read-only
    viewer = Experiment(None, "apitest1").view(port=0, non_blocking=True)
    try:
        assert viewer.get_status() == "VIEWED"
        assert len(viewer.list_trial_jobs()) == 2
        with pytest.raises(RuntimeError, match="readonly"):
            viewer.update_max_trial_number(5)
    finally:
        viewer.stop()

    # resume(): runs on with a raised maxTrialNumber; the ended trials are kept
    resumed = Experiment(None, "apitest1")
    resumed.load_checkpoint()
    resumed.config.max_trial_number = 3
    resumed.config.search_space = {"x": {"_type": "choice", "_value": [1, 2, 3]}, "pause": {"_type": "choice", "_value": [0]}}
    try:
        assert resumed.resume(port=0) is True
        jobs = resumed.list_trial_jobs()
        assert len(jobs) == 3 and {j.status for j in jobs} == {"SUCCEEDED"}
    finally:
        resumed.stop()
    with pytest.raises(RuntimeError, match="does not exist"):
        Experiment(None, "neverwas").resume()
    with pytest.raises(RuntimeError, match="does not exist"):
        Experiment(None, "neverwas").view()


def test_run_or_resume(tmp_path: Path, home: Path) -> None:
    from nni_manager import Experiment

    first = Experiment(_config(tmp_path, max_trial_number=1), "apitest2")
    try:
        assert first.run_or_resume(port=0) is True  # no checkpoint: run()
        assert len(first.list_trial_jobs()) == 1
    finally:
        first.stop()
    again = Experiment(_config(tmp_path, max_trial_number=2), "apitest2")
    try:
        assert again.run_or_resume(port=0) is True  # a checkpoint: resume(), the first trial kept
        jobs = again.list_trial_jobs()
        assert len(jobs) == 2 and sorted(j.sequenceId for j in jobs) == [0, 1]
    finally:
        again.stop()


def test_connect_updates_kill_and_stop(tmp_path: Path, home: Path) -> None:
    from nni_manager import Experiment

    space = {"x": {"_type": "choice", "_value": [1, 2, 3, 4, 5, 6]}, "pause": {"_type": "choice", "_value": [30]}}
    owner = Experiment(_config(tmp_path, max_trial_number=3, trial_concurrency=1, search_space=space), "apitest3")
    owner.start(port=0)
    try:
        from nni_manager.webui import manifest

        # what `nni-manager list` and `nnictl experiment list` read, right after start() returned
        assert manifest.read()["apitest3"]["status"] == "RUNNING"
        connected = Experiment.connect(owner.port)  # as NNI's python_api_connect.ipynb does
        assert connected.id == "apitest3" and connected.get_status() == "RUNNING"
        connected.update_trial_concurrency(2)
        connected.update_max_trial_number(4)
        connected.update_max_experiment_duration("1h")
        connected.update_search_space({**space, "x": {"_type": "choice", "_value": [7, 8]}})
        profile = connected.get_experiment_profile()["params"]
        assert (profile["trialConcurrency"], profile["maxTrialNumber"], profile["maxExperimentDuration"]) == (2, 4, "3600s")
        assert profile["searchSpace"]["x"]["_value"] == [7, 8]
        with pytest.raises(RuntimeError, match="trialConcurrency"):
            connected.update_trial_concurrency(0)
        _wait(lambda: sum(j.status == "RUNNING" for j in connected.list_trial_jobs()) == 2)
        running = [j.trialJobId for j in connected.list_trial_jobs() if j.status == "RUNNING"]
        connected.kill_trial_job(running[0])
        _wait(lambda: connected.get_trial_job(running[0]).status == "USER_CANCELED")
        connected.stop()  # stops the experiment through its REST API, as NNI's stop() does
        assert connected.port is None
        _wait(lambda: _stopped(owner))
        _wait(lambda: owner.port is None)  # its server is gone: the owner says how its run ended
        assert owner.get_status() == "STOPPED"
    finally:
        owner.stop()
    assert owner.get_status() == "STOPPED"
    assert all(j.status != "RUNNING" for j in _stored_trials(tmp_path / "exps" / "apitest3"))


def _stored_trials(directory: Path) -> list[Any]:
    from nni_manager.store import Store

    store = Store.open_readonly(directory)
    try:
        return store.trials()
    finally:
        store.close()


def test_script_that_never_stops_is_stopped_at_exit_without_noise(tmp_path: Path) -> None:
    """NNI registers stop() with atexit: a script ending mid-run leaves no process and no
    asyncio teardown noise."""
    config = _config(tmp_path, max_trial_number=2,
                     search_space={"x": {"_type": "choice", "_value": [1, 2]}, "pause": {"_type": "choice", "_value": [60]}})
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(f"""
        import time
        from nni_manager import Experiment
        e = Experiment({config.json()!r})  # NNI's canonical config as a dict
        e.start(0)
        while sum(j.status == "RUNNING" for j in e.list_trial_jobs()) < 2:
            time.sleep(0.2)
        print("ID", e.id)
    """))
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(home), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for noise in NOISE:
        assert noise not in proc.stderr, proc.stderr[-3000:]
    exp_id = proc.stdout.split("ID ", 1)[1].split()[0]
    trials = _stored_trials(tmp_path / "exps" / exp_id)
    assert len(trials) == 2 and {t.status.value for t in trials} == {"USER_CANCELED"}
    entry = json.loads((home / "nni-experiments" / ".experiment").read_text())[exp_id]
    assert entry["status"] == "STOPPED"


def test_raising_max_trial_number_reopens_a_done_experiment(tmp_path: Path, home: Path) -> None:
    """NNI 3.0 runs a DONE experiment on when maxTrialNumber is raised (nnimanager.ts)."""
    from nni_manager import Experiment

    space = {"x": {"_type": "choice", "_value": [1, 2, 3, 4]}, "pause": {"_type": "choice", "_value": [0]}}
    experiment = Experiment(_config(tmp_path, max_trial_number=2, search_space=space), "apitest4")
    assert experiment.run(port=0) is True
    try:
        assert experiment.get_status() == "DONE" and len(experiment.list_trial_jobs()) == 2
        experiment.update_max_trial_number(3)
        assert experiment.get_status() != "DONE"  # reopened at once
        assert experiment._wait_completion() is True
        jobs = experiment.list_trial_jobs()
        assert len(jobs) == 3 and {j.status for j in jobs} == {"SUCCEEDED"}
        assert sorted(j.sequenceId for j in jobs) == [0, 1, 2]
        assert experiment.get_experiment_profile()["params"]["maxTrialNumber"] == 3
        experiment.update_max_trial_number(3)  # not past what ended it: stays DONE
        assert experiment.get_status() == "DONE"
    finally:
        experiment.stop()


def test_a_reopen_while_the_ended_run_still_closes_never_reads_done(tmp_path: Path, home: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """run() returns once the status is DONE, while the ended run still stops its dispatcher and
    backend; maxTrialNumber raised then reopens it, and no status read until the third trial ends
    says DONE (the runner's finish("DONE") of the old run once showed DONE with 2 trials, under load).
    The old run's close is held until the limit is raised, and manifest writes are slowed, so the
    window that load opened is open every time."""
    from nni_manager import Experiment
    from nni_manager.experiment import Experiment as Loop
    from nni_manager.webui.server import WebServer

    raised = threading.Event()
    making = Loop._make_dispatcher
    syncing = WebServer.sync_manifest

    async def held_close(self: Loop, *args: Any) -> Any:
        dispatcher = await making(self, *args)
        closing = dispatcher.stop

        async def held_stop() -> None:
            if not raised.is_set():  # the first run's close: until the test has raised the limit
                await asyncio.to_thread(raised.wait, 120)
            await closing()

        dispatcher.stop = held_stop  # type: ignore[method-assign]
        return dispatcher

    async def slow_sync(self: WebServer) -> None:  # a loaded machine's disk
        await asyncio.sleep(1.0)
        await syncing(self)

    monkeypatch.setattr(Loop, "_make_dispatcher", held_close)
    monkeypatch.setattr(WebServer, "sync_manifest", slow_sync)
    space = {"x": {"_type": "choice", "_value": [1, 2, 3, 4]}, "pause": {"_type": "choice", "_value": [0]}}
    experiment = Experiment(_config(tmp_path, max_trial_number=2, search_space=space), "apitest5")
    try:
        assert experiment.run(port=0) is True  # DONE, with the old run's close still held
        experiment.update_max_trial_number(3)
        raised.set()
        seen = []
        while (status := experiment.get_status()) not in ("DONE", "STOPPED", "ERROR"):
            seen.append(status)
            time.sleep(0.05)
        jobs = experiment.list_trial_jobs()
        assert status == "DONE" and len(jobs) == 3, (status, len(jobs), seen)
        assert {j.status for j in jobs} == {"SUCCEEDED"}
    finally:
        raised.set()
        experiment.stop()


def test_nni_manager_list_and_stop_see_a_scripts_experiment(tmp_path: Path) -> None:
    """`nni-manager list` shows a Python-API experiment as running; `nni-manager stop ID` stops
    the experiment (its trials cancelled), not the script, whose run() then returns."""
    config = _config(tmp_path, max_trial_number=2,
                     search_space={"x": {"_type": "choice", "_value": [1, 2]}, "pause": {"_type": "choice", "_value": [60]}})
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(f"""
        from nni_manager import Experiment
        e = Experiment({config.json()!r}, "apistop1")
        print("run returned", e.run(0), e.get_status(), flush=True)
        e.stop()
        print("script goes on", flush=True)
    """))
    home = tmp_path / "home"
    home.mkdir()
    env = _env(home)
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "nni_manager", *args], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=180)

        def both_running() -> bool:
            try:
                trials = _stored_trials(tmp_path / "exps" / "apistop1")
            except Exception:  # noqa: BLE001 - not created yet
                return False
            return sum(t.status.value == "RUNNING" for t in trials) == 2

        _wait(lambda: both_running() and "apistop1" in cli("list").stdout, timeout=180)
        stopped = cli("stop", "apistop1")
        assert stopped.returncode == 0 and "stopped experiment apistop1" in stopped.stdout, stopped.stderr
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "run returned True STOPPED" in out and "script goes on" in out
    assert {t.status.value for t in _stored_trials(tmp_path / "exps" / "apistop1")} == {"USER_CANCELED"}
    assert "apistop1" not in cli("list").stdout
