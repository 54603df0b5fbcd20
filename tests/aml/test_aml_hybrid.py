"""Hybrid mode with a cluster platform: a local agent (fixed) and AML environments (elastic, on
the AML emulator) in one pool. Placement weighs both: a trial the busy machine cannot take goes
to an environment, one it can take stays on it; placementConstraint Device pins a trial to the
machine (`local`) or to the platform (`aml`)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from nni_manager.types import TrialJobApplicationForm
from tests.support.manager.helpers import TRIAL, form, release, sleeper, wait_status
from tests.support.bounded import run_bounded

T = 90.0


def pinned(f: TrialJobApplicationForm, host: str) -> TrialJobApplicationForm:
    f.placement_constraint = {"type": "Device", "gpus": [[host, 0]]}
    return f


def test_local_and_aml_in_one_pool_steered_by_placement_constraint(aml: Any, short_dir: Path) -> None:
    base = short_dir
    code = base / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    cfg = load_config({
        "trialCommand": f"{sys.executable} trial.py", "trialCodeDirectory": str(code), "trialConcurrency": 3,
        "experimentWorkingDirectory": str(base / "exps"), "trialGracePeriod": 2, "nniManagerIp": "127.0.0.1",
        "trainingService": [
            {"platform": "local", "agentEnv": {"NNI_AGENT_ARTIFICIAL_GPUS": "1"}},
            {**aml.aml_config(), "pollInterval": "0.3s"},
        ],
    })
    assert cfg.training_service.platform == "hybrid"

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            # pinned to the machine: it runs there, holding its GPU
            on_local = await ts.submit_trial_job(pinned(sleeper(base, 1, "local"), "local"))
            d = await wait_status(ts, on_local.id, "RUNNING", timeout=T)
            assert d.agent_id == "local" and d.environment_id is None, d
            # the machine is busy: an unconstrained trial goes to an AML environment
            spill = await ts.submit_trial_job(sleeper(base, 2, "spill"))
            # pinned to the platform: an AML environment too, never the machine
            on_aml = await ts.submit_trial_job(pinned(form(3, x=3, steps=1), "aml"))
            d = await wait_status(ts, spill.id, "RUNNING", timeout=T)
            assert d.environment_id and d.agent_id != "local", d
            d = await wait_status(ts, on_aml.id, "SUCCEEDED", timeout=T)
            assert d.environment_id and d.agent_id != "local", d
            release(base, "local")
            release(base, "spill")
            for t in (on_local, spill):
                await wait_status(ts, t.id, "SUCCEEDED", timeout=T)
            # the machine is free again: the next unconstrained trial takes it, not an environment
            after = await ts.submit_trial_job(form(4, x=4, steps=1))
            d = await wait_status(ts, after.id, "SUCCEEDED", timeout=T)
            assert d.agent_id == "local" and d.environment_id is None, d
            return ts.experiment_id

    exp = run_bounded(main(), 240)
    jobs = [j for j in aml.jobs() if j["name"].startswith(f"nni_exp_{exp}_")]
    assert jobs, "the AML part submitted no job"
    aml.wait_for(lambda: not aml.live_pids(), 60, what="no job process left")
