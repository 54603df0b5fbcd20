"""Why a trial ended travels as TrialStatus.end_cause (protocol 1.3), so the manager never
parses the human reason; agents older than 1.3 are still understood by their fixed wording."""
from __future__ import annotations

from pathlib import Path

from nni_agent.v1 import agent_pb2 as pb
from nni_manager.service.trials import end_cause
from tests.support.agent.trialkit import Recorder, make_spec, new_trial, python_command, run, run_trial, wait_until


def test_a_trial_that_exits_ends_exited(tmp_path: Path) -> None:
    for name in ("ok", "failed", "killed"):
        (tmp_path / name).mkdir()
    ok, _ = run_trial(tmp_path / "ok", "true")
    failed, _ = run_trial(tmp_path / "failed", "exit 3")
    killed, _ = run_trial(tmp_path / "killed", "exec " + python_command("import os; os.kill(os.getpid(), 9)"))
    assert [r.terminal.state for r in (ok, failed, killed)] == [
        pb.TRIAL_STATE_SUCCEEDED, pb.TRIAL_STATE_FAILED, pb.TRIAL_STATE_FAILED]
    assert {r.terminal.end_cause for r in (ok, failed, killed)} == {pb.END_CAUSE_EXITED}
    assert ok.statuses[0].end_cause == pb.END_CAUSE_UNSPECIFIED  # RUNNING has no cause yet


def test_time_limit_and_start_failure(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "s").mkdir()
    timed, _ = run_trial(tmp_path / "t", "sleep 30", limits=pb.Limits(max_duration_ms=200))
    assert (timed.terminal.state, timed.terminal.end_cause) == (pb.TRIAL_STATE_EARLY_STOPPED, pb.END_CAUSE_TIME_LIMIT)
    unstartable, _ = run_trial(tmp_path / "s", "true", code_directory=tmp_path / "no-such-dir")
    assert unstartable.terminal.state == pb.TRIAL_STATE_FAILED
    assert unstartable.terminal.end_cause == pb.END_CAUSE_START_FAILED


def test_cancel_and_agent_stop_say_who_stopped_the_trial(tmp_path: Path) -> None:
    cancelled, stopped, signalled = Recorder(), Recorder(), Recorder()

    async def body() -> None:
        trials = [new_trial(make_spec(tmp_path, "sleep 30", trial_id=f"tr{i}"), tmp_path, rec)
                  for i, rec in enumerate((cancelled, stopped, signalled))]
        for t in trials:
            await t.start()
        await wait_until(lambda: all(r.statuses for r in (cancelled, stopped, signalled)))
        await trials[0].cancel(True, "")
        await trials[1].stop(pb.TRIAL_STATE_SYS_CANCELED, "manager unreachable for 360 s")
        await trials[2].stop(pb.TRIAL_STATE_SYS_CANCELED, "agent received SIGTERM", pb.END_CAUSE_AGENT_SIGNALLED)
        for t in trials:
            await t.wait()

    run(body)
    assert cancelled.terminal.end_cause == pb.END_CAUSE_CANCELLED
    assert stopped.terminal.end_cause == pb.END_CAUSE_AGENT_STOPPED
    assert signalled.terminal.end_cause == pb.END_CAUSE_AGENT_SIGNALLED


def test_the_manager_reads_the_cause_and_an_old_agents_wording() -> None:
    new = pb.TrialStatus(state=pb.TRIAL_STATE_SYS_CANCELED, reason="agent received SIGTERM",
                         end_cause=pb.END_CAUSE_AGENT_STOPPED)
    assert end_cause(new) == pb.END_CAUSE_AGENT_STOPPED  # the field wins over words
    old = pb.TrialStatus(state=pb.TRIAL_STATE_SYS_CANCELED, reason="agent received SIGHUP")
    assert end_cause(old) == pb.END_CAUSE_AGENT_SIGNALLED
    old_other = pb.TrialStatus(state=pb.TRIAL_STATE_SYS_CANCELED, reason="manager unreachable for 360 s")
    assert end_cause(old_other) == pb.END_CAUSE_UNSPECIFIED
    failed = pb.TrialStatus(state=pb.TRIAL_STATE_FAILED, reason="agent received SIGTERM from its trial?")
    assert end_cause(failed) == pb.END_CAUSE_UNSPECIFIED  # only a system cancel can be a signalled agent
