"""Trial files over the agent stream (NNI's getTrialFile / fetchTrialOutput) with a real local agent:
text and binary files, whole directories, every refusal as its TrainingServiceError, and an
agent that is gone."""
from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nni_manager.config import ExperimentConfig
from nni_manager.errors import (
    AgentUnavailableError,
    ClusterMetadataNotFoundError,
    TrainingServiceError,
    TrialExistsError,
    TrialFileNotAllowedError,
    TrialFileNotFoundError,
    TrialFileTooLargeError,
    TrialNotFoundError,
)
from nni_manager.service import create_training_service
from tests.support.manager.helpers import form, until, wait_status
from tests.support.bounded import run_bounded

FILES_TRIAL = r'''
import os, sys
from pathlib import Path
out = Path(os.environ["NNI_OUTPUT_DIR"])
(out / "trial.log").write_text("sdk says hi\n")
(out / "output" / "deep").mkdir(parents=True)
(out / "output" / "model.bin").write_bytes(bytes(range(256)) * 2000)
(out / "output" / "deep" / "notes.txt").write_text("caf\u00e9\n")
os.symlink("/etc/hostname", out / "host-link")
os.symlink("/etc", out / "etc-link")
print("stdout line", flush=True)
print("stderr line", file=sys.stderr, flush=True)
'''
MODEL = bytes(range(256)) * 2000


def run(coro: Any) -> Any:
    return run_bounded(coro, 90)


@pytest.fixture
def files_config(make_config: Callable[..., ExperimentConfig], code_dir: Path) -> ExperimentConfig:
    (code_dir / "files_trial.py").write_text(FILES_TRIAL)
    return make_config(trial_command=f"{sys.executable} files_trial.py")


def test_files_and_directories_over_the_stream(files_config: ExperimentConfig, short_dir: Path) -> None:
    async def body() -> None:
        async with create_training_service(files_config) as ts:
            job = await ts.submit_trial_job(form(0))
            await wait_status(ts, job.id, "SUCCEEDED")
            assert await ts.get_trial_file(job.id, "trial.log") == "sdk says hi\n"
            streamed = ts.experiment_dir / "trials" / job.id / "trial.log"  # for `nni-manager logs`, the WebUI
            assert streamed.read_text() == "sdk says hi\n"
            assert "stdout line" in await ts.get_trial_file(job.id, "stdout")  # NNI's names for the streams
            assert "stderr line" in await ts.get_trial_file(job.id, "stderr")
            assert await ts.get_trial_file(job.id, "output/model.bin") == MODEL  # bytes: not a text name
            assert await ts.get_trial_file(job.id, "output/deep/notes.txt") == "caf\u00e9\n"

            written = await ts.download_trial_directory(job.id, short_dir / "all")
            names = {p.relative_to(short_dir / "all").as_posix() for p in written}
            assert {"trial.log", "trial.stdout", "trial.stderr", "parameter.cfg", "output/model.bin",
                    "output/deep/notes.txt"} <= names
            assert not any("link" in n for n in names)  # symlinks are never followed
            assert (short_dir / "all" / "output" / "model.bin").read_bytes() == MODEL
            await ts.download_trial_directory(job.id, short_dir / "out", "output")
            assert sorted(p.relative_to(short_dir / "out").as_posix() for p in (short_dir / "out").rglob("*")
                          if p.is_file()) == ["deep/notes.txt", "model.bin"]

    run(body())


def test_every_refusal_is_a_training_service_error(files_config: ExperimentConfig, short_dir: Path) -> None:
    async def body() -> None:
        async with create_training_service(files_config) as ts:
            job = await ts.submit_trial_job(form(0))
            await wait_status(ts, job.id, "SUCCEEDED")
            with pytest.raises(TrialNotFoundError) as unknown:
                await ts.get_trial_file("nosuch", "trial.log")
            assert isinstance(unknown.value, KeyError) and isinstance(unknown.value, TrainingServiceError)
            assert "nosuch" in str(unknown.value)
            with pytest.raises(TrialFileNotFoundError, match="missing.txt"):
                await ts.get_trial_file(job.id, "missing.txt")
            for name in ("../x", "/etc/hostname", "output/../../x"):
                with pytest.raises(TrialFileNotAllowedError):
                    await ts.get_trial_file(job.id, name)
            with pytest.raises(TrialFileNotAllowedError, match="outside"):  # refused by the agent
                await ts.get_trial_file(job.id, "host-link")
            with pytest.raises(TrialFileNotAllowedError):
                await ts.get_trial_file(job.id, "etc-link/hostname")
            with pytest.raises(TrialFileTooLargeError, match="limit"):
                await ts.download_trial_directory(job.id, short_dir / "small", max_bytes=1000)
            assert not (short_dir / "small" / "output").exists()  # refused before anything was written
            with pytest.raises(TrialFileTooLargeError):
                await ts.get_trial_file(job.id, "output/model.bin", max_bytes=1000)
            again = form(1)
            again.id = job.id
            with pytest.raises(TrialExistsError) as exists:  # the other API errors are TrainingServiceErrors too
                await ts.submit_trial_job(again)
            assert isinstance(exists.value, ValueError) and job.id in str(exists.value)
            with pytest.raises(ClusterMetadataNotFoundError) as meta:
                await ts.get_cluster_metadata("nosuch_key")
            assert isinstance(meta.value, KeyError) and isinstance(meta.value, TrainingServiceError)

    run(body())


def test_agent_gone(files_config: ExperimentConfig) -> None:
    async def body() -> None:
        async with create_training_service(files_config) as ts:
            job = await ts.submit_trial_job(form(0))
            await wait_status(ts, job.id, "SUCCEEDED")
            pid = int((ts.experiment_dir / "agents" / "local" / "agent.pid").read_text())
            os.kill(pid, signal.SIGKILL)
            await until(lambda: not ts.agent_connected("local"), 20, "the hub to notice the agent is gone")
            with pytest.raises(AgentUnavailableError, match="local"):
                await ts.get_trial_file(job.id, "output/model.bin")
            # the manager's own copies of the streamed logs still answer
            assert "stdout line" in await ts.get_trial_file(job.id, "stdout")
            assert await ts.get_trial_file(job.id, "trial.log") == "sdk says hi\n"
            waiting = await ts.submit_trial_job(form(1))
            with pytest.raises(TrialFileNotFoundError, match="not started"):
                await ts.get_trial_file(waiting.id, "trial.log")

    run(body())
