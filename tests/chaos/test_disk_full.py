"""The experiment directory's disk fills up mid-stream (a small tmpfs, mounted as root): the
manager says so clearly, acknowledges nothing it could not store (the agent keeps and replays
it), the store stays intact, and once space is freed the trial finishes with every metric
exactly once. The agent's own disk (the worker's) is elsewhere and never full."""
from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import sqlite3
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from nni_manager.service import create_training_service
from nni_manager.store import Store
from nni_manager.types import TrialJobMetric, TrialJobStatus
from tests.support.chaos.backend import RelayedBackend
from tests.support.chaos.relay import ChaosRelay
from tests.support.manager.helpers import form, until


@pytest.fixture
def small_disk(short_dir: Path) -> Iterator[Path]:
    mount = short_dir / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(path: Path) -> int:
    """Write `path` until the file system is full; returns the bytes written."""
    written = 0
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                written += f.write(chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                if len(chunk) == 1:
                    return written
                chunk = chunk[: len(chunk) // 8] or b"\0"


def _running(pid: int | None) -> bool:
    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _integrity(db: Path) -> str:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def test_disk_full_is_reported_and_nothing_unstored_is_acknowledged(
        relayed_platform: None, make_config: Callable, short_dir: Path, small_disk: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    n = 6000
    hold = short_dir / "hold" / "release"
    hold.parent.mkdir()

    async def body() -> None:
        relay = ChaosRelay(0)
        RelayedBackend.relay, RelayedBackend.agents, RelayedBackend.work_root = relay, 1, short_dir / "workers"
        heard: list[tuple[str, int]] = []

        def on_metric(m: TrialJobMetric) -> None:
            d = json.loads(m.data)
            heard.append((d["type"], d["sequence"]))

        config = make_config("relayed", reconnect_window=60.0, experiment_working_directory=small_disk)
        async with create_training_service(config) as ts:
            ts.add_trial_job_metric_listener(on_metric)
            db = ts.experiment_dir / "experiment.db"
            job = await ts.submit_trial_job(form(0, n=n, chunk=100, pause=0.1, hold=str(hold)))
            await until(lambda: len(heard) >= 200, 30, "the first metrics")
            filler = small_disk / "filler"
            await asyncio.to_thread(_fill, filler)
            await until(lambda: any("No space left" in r.getMessage() or "disk is full" in r.getMessage()
                                    for r in caplog.records if r.levelno >= logging.ERROR), 30,
                        "an error saying the disk is full")
            stuck = len(heard)
            hold.touch()  # the trial ends while the disk is full: its end cannot be stored either
            pid = ts.trial_pid(job.id)
            await until(lambda: not _running(pid), 30, "the trial process to exit")
            await asyncio.sleep(3)  # its last records reach the hub and fail to be stored
            assert _integrity(db) == "ok"
            stored = {(m["type"], m["sequence"]) for m in Store.open_readonly(ts.experiment_dir).metrics()}
            assert set(heard) <= stored  # listeners only hear what is stored
            assert not ts.trials.get(job.id).status.is_terminal  # nor does the table change unstored
            filler.unlink()  # space again: the agent's replay fills the gap
            await until(lambda: ts.trials.get(job.id).status.is_terminal, 60, "the trial to end")
            detail = await ts.get_trial_job(job.id)
            exp_dir = ts.experiment_dir
        await relay.stop()
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        print(f"heard {stuck} before the disk filled; errors: {errors[:3]}")
        assert len([e for e in errors if e.startswith("cannot store")]) == 1, errors  # once, not per redial
        assert "works again" in caplog.text
        assert detail.status == TrialJobStatus.SUCCEEDED, (detail.status, detail.message)
        assert [t.status for t in Store.open_readonly(exp_dir).trials()] == [TrialJobStatus.SUCCEEDED]
        assert _integrity(exp_dir / "experiment.db") == "ok"
        stored_all = Counter((m["type"], m["sequence"]) for m in Store.open_readonly(exp_dir).metrics())
        expected = {("PERIODICAL", i) for i in range(n)} | {("FINAL", 0)}
        assert set(stored_all) == expected and set(stored_all.values()) == {1}
        assert Counter(heard) == Counter(expected)

    caplog.set_level(logging.INFO)
    asyncio.run(body())


def test_a_batch_that_cannot_be_stored_changes_nothing_in_memory(
        relayed_platform: None, make_config: Callable, short_dir: Path, small_disk: Path) -> None:
    """The table in memory follows the store: a status whose transaction failed is not applied,
    so the agent's replay of it, once there is space, is (not ignored as already known)."""
    from nni_agent.v1 import agent_pb2 as pb

    async def body() -> None:
        RelayedBackend.relay, RelayedBackend.agents = ChaosRelay(0), 0  # no agent: the trial waits
        config = make_config("relayed", experiment_working_directory=small_disk)
        async with create_training_service(config) as ts:
            job = await ts.submit_trial_job(form(0))
            ts.core.add_agent("ghost")  # the trial is placed on it (an agent reports only its own trials)
            ts.trials.change(ts.trials.get(job.id), agents=["ghost"])
            running = pb.Record(seq=1, status=pb.TrialStatus(trial_id=job.id, state=pb.TRIAL_STATE_RUNNING, pid=42))

            def big(seq: int) -> pb.Record:
                data = json.dumps({"type": "PERIODICAL", "sequence": seq, "value": "x" * 8000})
                return pb.Record(seq=seq, metric=pb.Metric(trial_id=job.id, trial_seq=seq, data=data))

            filler = small_disk / "filler"
            await asyncio.to_thread(_fill, filler)
            with pytest.raises(sqlite3.Error):  # until the WAL has no room left either
                for seq in range(2, 500):
                    ts.core.apply_records("ghost", "boot", seq, [big(seq)])
            with pytest.raises(sqlite3.Error):
                ts.core.apply_records("ghost", "boot", 1000, [running, big(1000), big(1001)])
            assert ts.trials.get(job.id).status == TrialJobStatus.WAITING
            assert [t.id for t in ts.trials.live_on("ghost")] == [job.id]
            filler.unlink()
            ts.core.apply_records("ghost", "boot", 2, [running])  # the replay, with space again
            assert ts.trials.get(job.id).status == TrialJobStatus.RUNNING
            assert [t.status for t in Store.open_readonly(ts.experiment_dir).trials()] == [TrialJobStatus.RUNNING]
            await ts.cancel_trial_job(job.id)

    asyncio.run(body())
