"""The parts that keep one manager cheap with many agents and trials: the trial table's
indexes, the heap freezer, the hub's off-loop log files, heartbeats sized to the fleet and
WAL checkpoints off the event loop."""
from __future__ import annotations

import asyncio
import gc
import os
import random
import sqlite3
from pathlib import Path

from nni_manager.hub.logfiles import LogFiles
from nni_manager.service import heap
from nni_manager.service.heap import HeapFreezer
from nni_manager.service.trials import Trials
from nni_manager.store import Store
from nni_manager.types import TrialJobDetail, TrialJobStatus
from tests.support.manager.helpers import form, until
from tests.support.manager.hubkit import Agent, records, started_hub

_ENDS = (TrialJobStatus.SUCCEEDED, TrialJobStatus.FAILED, TrialJobStatus.USER_CANCELED)


def _check_indexes(trials: Trials, agents: list[str]) -> None:
    """The indexes against a scan of the whole table (what they replace)."""
    every = list(trials.by_id.values())
    assert [t.id for t in trials.waiting()] == [
        t.id for t in sorted(every, key=lambda t: t.sequence_id) if t.status == TrialJobStatus.WAITING and not t.agents]
    assert {t.id for t in trials.live()} == {t.id for t in every if not t.status.is_terminal}
    for a in agents:
        assert {t.id for t in trials.live_on(a)} == {t.id for t in every if a in t.agents and not t.status.is_terminal}


def test_trial_indexes_follow_every_change(tmp_path: Path) -> None:
    """Random submissions, placements, status changes, ends and rolled-back changes: the live,
    waiting (FIFO) and per-agent indexes always equal a full scan, and every agent whose live
    trials changed is reported as touched (placement rebuilds only those agents' views)."""
    rng = random.Random(20261123)
    store = Store.open(tmp_path)
    trials = Trials(store, notify=lambda t: None, wake=lambda: None)
    agents = ["a1", "a2", "a3"]
    for step in range(400):
        trials.by_id.touched.clear()
        live = trials.live()
        op = rng.choice(("submit", "place", "run", "message", "end", "rollback"))
        affected: set[str] = set()
        if op == "submit" or not live:
            t = TrialJobDetail(id=f"t{step:04d}", status=TrialJobStatus.WAITING, submit_time=step,
                               form=form(step), sequence_id=step)
            trials.by_id[t.id] = t
            store.save_trial(t)
        else:
            t = rng.choice(live)
            affected = set(t.agents)
            if op == "place" and not t.agents:
                chosen = rng.sample(agents, rng.choice((1, 2)))
                trials.change(t, agents=chosen, message="starting")
                affected |= set(chosen)
            elif op == "run" and t.agents:
                if t.status == TrialJobStatus.RUNNING:
                    affected = set()  # no change
                trials.change(t, status=TrialJobStatus.RUNNING)
            elif op == "message":
                trials.change(t, message=f"note {step}")
                affected = set()  # nothing placement looks at
            elif op == "end":
                trials.finish(t, rng.choice(_ENDS), "done")
            elif op == "rollback":
                try:
                    with trials.undone_on_failure({t.id}):
                        trials.change(t, status=TrialJobStatus.RUNNING, agents=["a3"])
                        raise sqlite3.OperationalError("database or disk is full")
                except sqlite3.OperationalError:
                    pass
                affected |= {"a3"}
            else:
                affected = set()
        assert affected <= trials.by_id.touched, (step, op, affected, trials.by_id.touched)
        _check_indexes(trials, agents)
    assert trials.waiting() and any(trials.live_on(a) for a in agents)  # the walk covered both kinds
    reopened = Trials(store, notify=lambda t: None, wake=lambda: None)  # a restarted manager's indexes
    _check_indexes(reopened, agents)
    store.close()


def test_heap_freezer_freezes_at_start_and_as_the_table_grows() -> None:
    gc.unfreeze()
    try:
        freezer = HeapFreezer(min_growth=100)
        assert freezer.grown_to(50)
        assert gc.get_freeze_count() > 0  # what was alive went to the permanent generation
        assert not freezer.grown_to(120)  # grew by less than min_growth: left alone
        assert freezer.grown_to(150)
        assert not freezer.grown_to(249) and freezer.grown_to(250)
        freezer.release()  # the service's clean-up: cycles among them can be collected again
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


def test_bulk_suspends_the_collector_and_restores_its_state() -> None:
    assert gc.isenabled()
    with heap.bulk():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with heap.bulk():
            pass
        assert not gc.isenabled()  # a caller's own choice is kept
    finally:
        gc.enable()


def test_log_files_write_at_offsets_replay_and_bound_open_files(tmp_path: Path) -> None:
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    files = LogFiles(keep_open=4)
    before = open_fds()
    paths = [tmp_path / f"trial{i}" / "trial.stdout" for i in range(10)]
    for i, path in enumerate(paths):
        files.write([(path, 0, b"hello "), (path, 6, f"world {i}\n".encode())])
    files.write([(paths[3], 6, b"world 3\n"), (paths[3], 14, b"more\n")])  # a replay, then new data
    assert open_fds() - before <= 4  # only the most recently used stay open
    assert [p.read_bytes() for p in paths[:3]] == [f"hello world {i}\n".encode() for i in range(3)]
    assert paths[3].read_bytes() == b"hello world 3\nmore\n"
    files.write([(paths[0], 14, b"again\n")])  # a closed file is opened again at its offset
    assert paths[0].read_bytes() == b"hello world 0\nagain\n"
    files.close()
    assert open_fds() == before


def test_heartbeat_interval_grows_with_the_fleet(short_dir: Path) -> None:
    """A few agents beat every 2 s; 1,000 registered agents are told 4 s (250 beats/s in all),
    and silence is judged against the longest interval told."""

    async def body() -> tuple[int, int, int, float]:
        hub, _ = await started_hub(short_dir, heartbeat_interval=2.0)
        small = await (agent := Agent(hub)).connect()
        await agent.close()
        for i in range(999):
            hub.register(f"sim{i}", f"token-{i}")
        agent = Agent(hub, boot_id="boot2")
        big = await agent.connect()
        await agent.send(records=records((1, {"log": {"trial_id": "t1", "offset": 0, "data": b"line\n"}})))
        ack = await agent.read("ack")
        await agent.close()
        silence = 3 * hub._told_heartbeat + 2.0  # what _watch_contact allows
        await hub.stop()
        return small.heartbeat_interval_ms, big.heartbeat_interval_ms, ack.seq, silence

    small, big, acked, silence = asyncio.run(body())
    assert small == 2000 and big == 4000
    assert silence == 3 * 4.0 + 2.0
    assert acked == 1 and (short_dir / "trials" / "t1" / "trial.stdout").read_bytes() == b"line\n"


def test_wal_is_checkpointed_off_the_writing_connection(tmp_path: Path) -> None:
    """The store's own connection never checkpoints (it would fsync inside a commit, on the
    event loop); the checkpointer thread copies the WAL into the database meanwhile."""
    store = Store.open(tmp_path)
    assert store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    db = tmp_path / "experiment.db"
    size0 = db.stat().st_size
    with store.transaction():
        for i in range(3000):
            store.add_metric(f"t{i % 7}", "a", "b", i, i, "x" * 200, i)

    async def copied() -> None:
        await until(lambda: db.stat().st_size > size0 + 500_000, 10, "the WAL checkpointed into the database")

    asyncio.run(copied())
    store.close()
    assert len(Store.open_readonly(tmp_path).metrics()) == 3000
