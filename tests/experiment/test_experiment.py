"""The experiment loop end to end through the real local backend and agent."""
from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest

from nni_manager.loader import load_config
from nni_manager.experiment import Experiment, NoWorkerError
from nni_manager.store import Store
from nni_manager.types import TrialJobStatus

from tests.support.experiment.fixtures import processes_under
from tests.support.bounded import run_bounded


def test_runs_grid_to_the_end_and_picks_best(make_config) -> None:
    config = load_config(make_config(tuner={"name": "GridSearch", "classArgs": {"optimize_mode": "minimize"}},
                                     maxTrialNumber=10))
    events: list[tuple[str, str]] = []
    experiment = Experiment(config, on_event=lambda kind, t: events.append((kind, t.trial_id)), poll_interval=0.2)
    result = asyncio.run(experiment.run())
    assert result.stop_reason == "the tuner has no more parameters"
    assert sorted(t.parameters["x"] for t in result.trials) == [1, 2, 3, 4]
    assert all(t.status == TrialJobStatus.SUCCEEDED for t in result.trials)
    assert all(t.final == {"default": t.parameters["x"], "other": 1} for t in result.trials)
    assert all(t.latest == t.parameters["x"] * 2 and t.intermediate_count == 3 for t in result.trials)
    assert result.best is not None and result.best.parameters == {"x": 1}  # minimize
    assert {kind for kind, _ in events} == {"submitted", "status", "intermediate", "final"}
    store = Store.open_readonly(result.experiment_dir)
    try:
        details = store.trials()
    finally:
        store.close()
    for d in details:
        record = json.loads(d.form.hyper_parameters.value)
        assert record["parameter_source"] == "algorithm" and record["parameter_index"] == 0
        assert record["parameter_id"] == d.sequence_id


def test_max_trial_number_and_concurrency(make_config) -> None:
    config = load_config(make_config(tuner={"name": "Random", "classArgs": {"seed": 3}},
                                     searchSpace={"x": {"_type": "uniform", "_value": [0, 1]}},
                                     maxTrialNumber=3, trialConcurrency=2))
    live_peak = 0
    experiment = Experiment(config, poll_interval=0.2)

    def watch(kind: str, trial) -> None:
        nonlocal live_peak
        live_peak = max(live_peak, experiment.live_count())

    experiment._on_event = watch
    result = asyncio.run(experiment.run())
    assert len(result.trials) == 3 and result.stop_reason.startswith("maxTrialNumber")
    assert live_peak == 2
    assert result.best is not None and result.best.metric == max(t.metric for t in result.trials)


def test_multi_phase_parameter_requests_answered(make_config) -> None:
    config = load_config(make_config("multiphase.py", maxTrialNumber=1, trialConcurrency=1,
                                     searchSpace={"x": {"_type": "choice", "_value": [10, 20]}}))
    result = asyncio.run(Experiment(config, poll_interval=0.2).run())
    (trial,) = result.trials
    assert trial.status == TrialJobStatus.SUCCEEDED
    assert trial.final == 30  # first grid point 10, second 20


def test_max_trial_duration_early_stops(make_config) -> None:
    config = load_config(make_config("sleepy.py", maxTrialNumber=1, trialConcurrency=1, maxTrialDuration=1))
    result = asyncio.run(Experiment(config, poll_interval=0.2).run())
    (trial,) = result.trials
    assert trial.status == TrialJobStatus.EARLY_STOPPED
    assert processes_under(config.trial_code_directory) == []


def test_cancel_stops_trials_user_canceled(make_config) -> None:
    config = load_config(make_config("sleepy.py", maxTrialNumber=2, trialConcurrency=2, logLevel="debug"))
    experiment = Experiment(config, poll_interval=0.2)
    began = time.monotonic()
    times: dict[str, float] = {}  # when each step was done (one CI run took 120 s: which step waited?)

    async def main() -> None:
        task = asyncio.create_task(experiment.run())
        deadline = time.monotonic() + 100  # both running well before their 120 s sleep ends, even under load
        while time.monotonic() < deadline:
            running = [t for t in experiment.trials.values() if t.status == TrialJobStatus.RUNNING]
            if len(running) == 2:
                break
            await asyncio.sleep(0.05)
        assert len(running) == 2, {t.trial_id: t.status for t in experiment.trials.values()}
        times["both running"] = time.monotonic() - began
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        times["run() ended"] = time.monotonic() - began

    asyncio.run(main())
    statuses = {t.status for t in experiment.trials.values()}
    if statuses != {TrialJobStatus.USER_CANCELED}:
        logs = "\n".join(f"--- {f}\n" + f.read_text(errors="replace")[-6000:]
                         for f in sorted(experiment.experiment_dir.rglob("*.log")))
        raise AssertionError(f"{statuses} after {times}\n{logs}")
    assert len(experiment.trials) == 2
    assert experiment.result().stop_reason == "interrupted"
    assert processes_under(config.trial_code_directory) == []


def test_a_stop_during_the_clean_up_keeps_the_done_record(make_config) -> None:
    """A SIGTERM (`nni-manager stop`) that lands after the experiment is DONE but while it still
    cleans up must not cut the clean-up short: the store still says DONE, and why."""
    config = load_config(make_config(maxTrialNumber=2, trialConcurrency=2))
    experiment = Experiment(config, poll_interval=0.2)
    cancels = 0

    async def main() -> None:
        nonlocal cancels
        task = asyncio.create_task(experiment.run())
        while experiment.status != "DONE" and not task.done():
            await asyncio.sleep(0.005)
        while not task.done():  # keep asking it to stop while it cleans up
            task.cancel()
            cancels += 1
            await asyncio.sleep(0.01)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert cancels > 0  # the stop requests did arrive during the clean-up
    store = Store.open_readonly(experiment.experiment_dir)
    try:
        assert store.experiment()["status"] == "DONE"
        assert store.setting("stop_reason") == "maxTrialNumber (2) reached"
    finally:
        store.close()
    assert all(t.status == TrialJobStatus.SUCCEEDED for t in experiment.trials.values())
    assert processes_under(config.trial_code_directory) == []


def test_stops_when_no_machine_is_usable(make_config) -> None:
    import socket

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ts = {"platform": "remote", "machineList": [{"host": "127.0.0.1", "port": port, "user": "nobody",
                                                 "password": "pw"}]}
    config = load_config(make_config(maxTrialNumber=None, trainingService=ts,
                                     tuner={"name": "Random"},
                                     searchSpace={"x": {"_type": "uniform", "_value": [0, 1]}}))
    experiment = Experiment(config, poll_interval=0.1)
    with pytest.raises(NoWorkerError, match="no machine is usable.*cannot connect"):  # a failure, never success
        run_bounded(experiment.run(), 60)
    result = experiment.result()
    assert experiment.status == "ERROR" and result.error.startswith("no machine is usable")
    assert result.stop_reason == "no worker could start"
    assert len(result.trials) <= config.trial_concurrency  # it did not keep submitting doomed trials
    assert all(t.status == TrialJobStatus.FAILED for t in result.trials)


def test_resumed_experiment_names_the_best_trial(make_config) -> None:
    """A resumed experiment reads its trials' final metrics back from the store (the summary
    used to say no trial had reported one)."""
    config = load_config(make_config(tuner={"name": "GridSearch"}, maxTrialNumber=4))
    first = asyncio.run(Experiment(config, poll_interval=0.2).run())
    assert first.best is not None
    again = asyncio.run(Experiment(config, experiment_id=first.experiment_id, poll_interval=0.2).run())
    assert again.stop_reason.startswith("maxTrialNumber") and len(again.trials) == 4
    assert again.best is not None and again.best.trial_id == first.best.trial_id
    assert again.best.metric == first.best.metric


def test_nan_final_metric_is_never_ranked_best(make_config, tmp_path) -> None:
    (tmp_path / "code" / "nan.py").write_text(
        "import nni_agent as nni\np = nni.get_next_parameter()\n"
        "nni.report_final_result(float('nan') if p['x'] == 1 else p['x'])\n")
    config = load_config(make_config("nan.py", tuner={"name": "GridSearch"}, maxTrialNumber=4))
    result = asyncio.run(Experiment(config, poll_interval=0.2).run())
    assert len(result.trials) == 4 and result.best is not None
    assert result.best.parameters == {"x": 4}  # maximize; the NaN trial (x=1, ranked first) is not "best"
