"""A trial's final status: exit codes, signals, setup errors, cancel, tree kill, max duration."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import psutil

from nni_agent.v1 import agent_pb2 as pb
from tests.support.agent.trialkit import (
    AGENT_KEY, Recorder, make_spec, marked_processes, new_trial, python_command, run, run_trial, wait_until,
)

MARKER = f"{AGENT_KEY}/trA01"


def test_success_fills_status(tmp_path: Path) -> None:
    rec, trial = run_trial(tmp_path, "echo hello")
    assert [s.state for s in rec.statuses] == [pb.TRIAL_STATE_RUNNING, pb.TRIAL_STATE_SUCCEEDED]
    running, final = rec.statuses
    assert running.pid > 0 and running.pid == final.pid == trial.root_pid()
    assert final.has_exit_code and final.exit_code == 0 and final.signal == 0
    assert 0 < final.start_time_ms <= final.end_time_ms
    assert final.working_directory == str(trial.sys_dir)
    assert rec.stdout == b"hello\n"
    assert trial.snapshot() == final and trial.done


def test_exit_code_with_last_stderr_line(tmp_path: Path) -> None:
    rec, _ = run_trial(tmp_path, "echo first >&2; echo 'the real error' >&2; echo >&2; exit 3")
    final = rec.terminal
    assert final.state == pb.TRIAL_STATE_FAILED
    assert final.has_exit_code and final.exit_code == 3
    assert final.reason == "exit code 3: the real error"


def test_long_stderr_line_is_truncated_in_reason(tmp_path: Path) -> None:
    rec, _ = run_trial(tmp_path, python_command("import sys; sys.stderr.write('x' * 5000 + '\\n'); sys.exit(1)"))
    assert rec.terminal.reason.startswith("exit code 1: xxx")
    assert len(rec.terminal.reason) < 400


def test_command_not_found(tmp_path: Path) -> None:
    rec, _ = run_trial(tmp_path, "no-such-command-xyz --flag")
    final = rec.terminal
    assert final.state == pb.TRIAL_STATE_FAILED and final.exit_code == 127
    assert "command not found" in final.reason and "no-such-command-xyz" in final.reason


def test_killed_by_signal(tmp_path: Path) -> None:
    rec, _ = run_trial(tmp_path, "exec " + python_command("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"))
    final = rec.terminal
    assert final.state == pb.TRIAL_STATE_FAILED
    assert not final.has_exit_code and final.signal == 11
    assert final.reason == "killed by signal SIGSEGV"


def test_working_directory_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    rec, trial = run_trial(tmp_path, "echo never", working_directory=str(blocker / "sys"))
    assert [s.state for s in rec.statuses] == [pb.TRIAL_STATE_FAILED]
    assert "cannot create the trial directory" in rec.terminal.reason and str(blocker / "sys") in rec.terminal.reason
    assert trial.root_pid() is None


def test_missing_code_directory(tmp_path: Path) -> None:
    rec, _ = run_trial(tmp_path, "echo never", code_directory=tmp_path / "gone")
    assert [s.state for s in rec.statuses] == [pb.TRIAL_STATE_FAILED]
    assert "code directory" in rec.terminal.reason and "gone" in rec.terminal.reason


def _cancel_scenario(tmp_path: Path, command: str, *, early: bool, ready_file: Path,
                     grace_ms: int = 300) -> tuple[Recorder, list[int]]:
    rec = Recorder()
    spec = make_spec(tmp_path, command, limits=pb.Limits(grace_period_ms=grace_ms))

    async def body() -> list[int]:
        trial = new_trial(spec, tmp_path, rec)
        await trial.start()
        await wait_until(ready_file.exists, what="the trial to get ready")
        pids = [p.pid for p in marked_processes(MARKER)]
        await trial.cancel(early, "stop it")
        await trial.cancel(early, "second cancel is a no-op")
        await trial.wait()
        return pids

    return rec, run(body)


def test_cancel_kills_children_that_ignore_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = ("import signal, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             f"pathlib.Path({str(ready)!r}).touch(); time.sleep(120)")
    command = python_command(child) + " & " + python_command(child.replace("touch()", "exists()")) + " & wait"
    rec, pids = _cancel_scenario(tmp_path, command, early=False, ready_file=ready)
    assert len(pids) >= 3  # sh + two pythons
    final = rec.terminal
    assert final.state == pb.TRIAL_STATE_USER_CANCELED and final.reason == "stop it"
    assert [s.state for s in rec.statuses].count(pb.TRIAL_STATE_USER_CANCELED) == 1
    assert marked_processes(MARKER) == []


def test_cancel_kills_daemonised_grandchild(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    pidfile = tmp_path / "daemon.pid"
    daemon = (
        "import os, time, pathlib, signal\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"        pathlib.Path({str(pidfile)!r}).write_text(str(os.getpid()))\n"
        f"        pathlib.Path({str(ready)!r}).touch()\n"
        "        time.sleep(120)\n"
        "    os._exit(0)\n"
        "os.wait()\n"
        "time.sleep(120)\n"
    )
    rec, _ = _cancel_scenario(tmp_path, python_command(daemon), early=True, ready_file=ready)
    daemon_pid = int(pidfile.read_text())
    assert rec.terminal.state == pb.TRIAL_STATE_EARLY_STOPPED
    assert marked_processes(MARKER) == []
    assert not psutil.pid_exists(daemon_pid) or psutil.Process(daemon_pid).status() == psutil.STATUS_ZOMBIE


def test_cancel_wins_over_exit_code(tmp_path: Path) -> None:
    """NNI reported a killed trial by its exit code; a cancel is a cancel."""
    ready = tmp_path / "ready"
    command = "exec " + python_command(
        f"import signal, sys, time, pathlib; signal.signal(signal.SIGINT, lambda *a: sys.exit(0)); "
        f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)")
    rec, _ = _cancel_scenario(tmp_path, command, early=False, ready_file=ready)
    final = rec.terminal
    assert final.state == pb.TRIAL_STATE_USER_CANCELED
    assert final.has_exit_code and final.exit_code == 0


def test_finished_trial_leaves_nothing_behind(tmp_path: Path) -> None:
    pidfile = tmp_path / "bg.pid"
    bg = python_command("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)")
    rec, _ = run_trial(tmp_path, f"{bg} >/dev/null 2>&1 & echo $! > {pidfile}; exit 0",
                       limits=pb.Limits(grace_period_ms=200))
    assert rec.terminal.state == pb.TRIAL_STATE_SUCCEEDED
    pid = int(pidfile.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert marked_processes(MARKER) == []


def test_max_duration_early_stops(tmp_path: Path) -> None:
    rec, _ = run_trial(tmp_path, "sleep 30", limits=pb.Limits(max_duration_ms=300))
    final = rec.terminal
    assert final.state == pb.TRIAL_STATE_EARLY_STOPPED
    assert final.reason == "exceeded the maximum trial duration of 0.3s"
    assert final.signal == 2  # sleep died of the default kill signal: SIGINT, as NNI 3's trial keeper sends


def test_custom_kill_signal(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    command = python_command(
        f"import signal, sys, time, pathlib; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        f"signal.signal(signal.SIGTERM, lambda *a: sys.exit(5)); pathlib.Path({str(ready)!r}).touch(); time.sleep(60)")
    rec = Recorder()
    spec = make_spec(tmp_path, "exec " + command, limits=pb.Limits(kill_signal=15, grace_period_ms=10_000))

    async def body() -> None:
        trial = new_trial(spec, tmp_path, rec)
        await trial.start()
        await wait_until(ready.exists)
        await trial.cancel(False, "")
        await trial.wait()

    run(body)
    assert rec.terminal.state == pb.TRIAL_STATE_USER_CANCELED and rec.terminal.reason == "canceled"
    assert rec.terminal.exit_code == 5  # exited through its SIGINT handler, not SIGKILL after the grace


def test_cancel_before_start_and_shutdown(tmp_path: Path) -> None:
    rec = Recorder()
    rec2 = Recorder()

    async def body() -> None:
        trial = new_trial(make_spec(tmp_path, "sleep 30"), tmp_path, rec)
        await trial.cancel(True, "not needed")
        await trial.start()
        await trial.wait()
        other = new_trial(make_spec(tmp_path, "sleep 30", trial_id="trB02"), tmp_path, rec2)
        await other.start()
        assert other.snapshot().state == pb.TRIAL_STATE_RUNNING
        await other.stop(pb.TRIAL_STATE_SYS_CANCELED, "agent shutting down")
        await other.wait()
        assert other.done

    run(body)
    assert [s.state for s in rec.statuses] == [pb.TRIAL_STATE_EARLY_STOPPED]
    assert rec.terminal.reason == "not needed"
    assert [s.state for s in rec2.statuses] == [pb.TRIAL_STATE_RUNNING, pb.TRIAL_STATE_SYS_CANCELED]
    assert rec2.terminal.reason == "agent shutting down"


def test_many_concurrent_trials_are_all_reaped(tmp_path: Path) -> None:
    recs = [Recorder() for _ in range(20)]

    async def body() -> None:
        trials = [new_trial(make_spec(tmp_path, f"exit {i % 3}", trial_id=f"t{i:04d}"), tmp_path, rec)
                  for i, rec in enumerate(recs)]
        for trial in trials:
            await trial.start()
        await asyncio.gather(*(t.wait() for t in trials))

    run(body)
    assert [r.terminal.exit_code for r in recs] == [i % 3 for i in range(20)]
    assert all(r.events_after_terminal == 0 for r in recs)
    zombies = [c for c in psutil.Process(os.getpid()).children() if c.status() == psutil.STATUS_ZOMBIE]
    assert zombies == []
