"""An agent is SIGKILLed mid-trial (a machine lost, an OOM killer): as documented, its trials
are kept while the reconnect window runs, their message saying contact is lost, then end
SYS_CANCELED with the reason; the other agent's trials are untouched and new trials go to it.
On the worker, the killed agent's guardian kills its trial processes at once: nothing of it
runs on."""
from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from pathlib import Path

import psutil

from nni_manager.service import create_training_service
from nni_manager.service.trials import CONTACT_LOST
from nni_manager.types import TrialJobStatus
from tests.support.chaos.backend import RelayedBackend
from tests.support.chaos.relay import ChaosRelay
from tests.support.manager.helpers import form, kill_tree, until


def test_agent_sigkill_ends_its_trials_after_the_window(
        relayed_platform: None, make_config: Callable, short_dir: Path, chaos_seed: int) -> None:
    hold = short_dir / "hold" / "release"
    hold.parent.mkdir()

    async def body() -> None:
        relay = ChaosRelay(chaos_seed)
        RelayedBackend.relay, RelayedBackend.agents, RelayedBackend.work_root = relay, 2, short_dir / "workers"
        window = 2.0
        async with create_training_service(make_config("relayed", reconnect_window=window)) as ts:
            await until(lambda: len(ts.agents()) == 2 and all(a["connected"] for a in ts.agents()), 30, "agents")
            jobs = [await ts.submit_trial_job(form(i, n=5, hold=str(hold))) for i in range(2)]
            await until(lambda: all(ts.trials.get(j.id).status == TrialJobStatus.RUNNING for j in jobs), 30,
                        "both trials running")
            victim_trial = jobs[0].id
            victim = ts.trials.get(victim_trial).agent_id
            other = next(j.id for j in jobs if ts.trials.get(j.id).agent_id != victim)
            left = psutil.Process(RelayedBackend.procs[victim].pid).children(recursive=True)  # trial + guardian
            assert ts.trial_pid(victim_trial) in {p.pid for p in left} and len(left) >= 2
            RelayedBackend.procs[victim].send_signal(signal.SIGKILL)
            RelayedBackend.procs[victim].wait()
            try:
                await until(lambda: not [p for p in left if _running(p)], 10,
                            "the killed agent's trial processes and guardian to be gone")
            except AssertionError:
                for p in left:  # never outlive the test
                    if _running(p):
                        kill_tree(p.pid)
                raise
            lost = await until(lambda: ts.trials.get(victim_trial).message.startswith(CONTACT_LOST)
                               and ts.trials.get(victim_trial), 10, "the contact-lost message")
            assert f"{victim} lost at" in lost.message and f"waiting up to {window:g} s" in lost.message
            assert lost.status == TrialJobStatus.RUNNING
            ended = await until(lambda: ts.trials.get(victim_trial).status.is_terminal
                                and ts.trials.get(victim_trial), 20, "the window to run out")
            assert ended.status == TrialJobStatus.SYS_CANCELED, (ended.status, ended.message)
            assert ended.message == f"agent {victim} did not reconnect within {window:g} s"
            assert not ts.trials.get(other).status.is_terminal  # the other agent's trial goes on
            later = await ts.submit_trial_job(form(9, n=3))
            done = await until(lambda: ts.trials.get(later.id).status.is_terminal and ts.trials.get(later.id), 30,
                               "a new trial on the surviving agent")
            assert done.status == TrialJobStatus.SUCCEEDED and done.agent_id != victim
            hold.touch()
            await until(lambda: ts.trials.get(other).status.is_terminal, 30, "the other trial")
            assert ts.trials.get(other).status == TrialJobStatus.SUCCEEDED
        await relay.stop()

    asyncio.run(body())


def _running(proc: psutil.Process) -> bool:
    """Alive and not a zombie; False for a recycled pid (psutil checks the start time)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    return False
