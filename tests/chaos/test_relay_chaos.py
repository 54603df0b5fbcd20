"""Agents behind a relay that cuts, stalls and half-closes their connections at random,
against the production hub and service: at least 100 connection losses during a
100,000-metric stream (two trials of 50,000), and every metric arrives exactly once, trials
end right. CHAOS_SEED replays the relay's choices."""
from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil

from nni_manager.service import create_training_service
from nni_manager.store import Store
from nni_manager.types import TrialJobMetric, TrialJobStatus
from tests.support.chaos.backend import RelayedBackend
from tests.support.chaos.relay import ChaosRelay
from tests.support.manager.helpers import form, until


def _stream_ids(metrics: list[dict]) -> Counter:
    return Counter((m["trial_id"], m["type"], m["sequence"]) for m in metrics)


def test_cuts_stalls_and_half_closes_lose_and_duplicate_nothing(
        relayed_platform: None, make_config: Callable, short_dir: Path, chaos_seed: int) -> None:
    n = 50_000  # per trial

    async def body() -> None:
        relay = ChaosRelay(chaos_seed)
        RelayedBackend.relay, RelayedBackend.agents, RelayedBackend.work_root = relay, 2, short_dir / "workers"
        heard: list[tuple[str, str, int]] = []

        def on_metric(m: TrialJobMetric) -> None:
            d = json.loads(m.data)
            heard.append((m.id, d["type"], d["sequence"]))

        config = make_config("relayed", reconnect_window=60.0, trial_concurrency=2)
        stop = asyncio.Event()
        async with create_training_service(config) as ts:
            ts.add_trial_job_metric_listener(on_metric)
            await until(lambda: all(a["connected"] for a in ts.agents()) and len(ts.agents()) == 2, 30, "agents")
            chaos = asyncio.create_task(relay.chaos(stop, every=(0.02, 0.1)))
            # paced to last about 15 s, so the relay has time for 100 losses mid-stream
            jobs = [await ts.submit_trial_job(form(i, n=n, chunk=400, pause=0.12)) for i in range(2)]
            for job in jobs:
                await until(lambda jid=job.id: ts.trials.get(jid).status.is_terminal, 180, f"trial {job.id} to end")
            stop.set()
            await chaos
            details = [await ts.get_trial_job(j.id) for j in jobs]
            exp_dir = ts.experiment_dir
            agent_pids = [p.pid for p in RelayedBackend.procs.values()]
        await relay.stop()
        print("relay:", dict(relay.counts))
        assert all(d.status == TrialJobStatus.SUCCEEDED for d in details), [(d.status, d.message) for d in details]
        expected = {(d.id, "PERIODICAL", i) for d in details for i in range(n)} | {(d.id, "FINAL", 0) for d in details}
        stored = _stream_ids(Store.open_readonly(exp_dir).metrics())
        assert set(stored) == expected, f"lost {len(expected - set(stored))}, foreign {len(set(stored) - expected)}"
        assert set(stored.values()) == {1}, "a metric was stored twice"
        assert Counter(heard) == Counter(expected), "the listener heard a metric twice or not at all"
        assert relay.counts["cut"] + relay.counts["half-close"] >= 100 and relay.counts["connections"] >= 50, relay.counts
        assert not [p for p in agent_pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]

    asyncio.run(body())
