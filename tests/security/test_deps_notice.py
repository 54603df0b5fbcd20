"""Where the manager cannot ship the agent's dependencies (no package index, no agentWheelhouse),
the console of `nni-manager run` says so once per experiment, with the fix, and the failed
trial's message points there: not only log/nnimanager.log. One path for every backend that ships
them (agent_deps.resolve / resolve_for_pythons say it), tried on each: Kubernetes, remote (real
sshd), OpenPAI and AML (their emulators), with bare images or a bare Python, downloads off and an
empty wheel cache, as in every test. (Slurm: tests/slurm/test_slurm_deps.py.)"""
from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nni_manager import cli, notices
from nni_manager.backends import agent_deps
from nni_manager.config import ExperimentConfig
from nni_manager.service import create_training_service
from tests.support.aml.fixtures import aml_factory  # noqa: F401 (fixture)
from tests.support.kube.fixtures import kube, kube_factory  # noqa: F401 (fixtures)
from tests.support.kube.harness import SLIM_IMAGE, config, pods_service
from tests.support.manager.helpers import TRIAL, form, wait_status
from tests.support.openpai.fixtures import pai_factory  # noqa: F401 (fixture)
from tests.support.remote.fixtures import plain_sshd, ssh_keys, ssh_user  # noqa: F401 (fixtures)
from tests.support.storage.fixtures import azurite  # noqa: F401 (fixture)
from tests.support.bounded import run_bounded

SAID = "cannot ship the agent's dependencies"
STOCK = Path("/usr/bin/python3")


def _messages(cfg: ExperimentConfig, trials: int = 2) -> list[str]:
    """Run `trials` trials to their end, the console's notices shown as `nni-manager run` shows them."""
    cli._console_notices(cfg)
    try:
        async def body() -> list[str]:
            async with create_training_service(cfg) as ts:
                jobs = [await ts.submit_trial_job(form(i)) for i in range(trials)]
                return [(await wait_status(ts, t.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=120)).message
                        for t in jobs]

        return run_bounded(body(), 240)
    finally:
        for h in [h for h in notices.log.handlers if getattr(h, "nni_console", False)]:
            notices.log.removeHandler(h)


def _said_once(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    said = [line for line in capsys.readouterr().err.splitlines() if SAID in line]
    assert len(said) == 1, said
    assert "Fix: fill agentWheelhouse" in said[0] and all(w in said[0] for w in words), said
    return said[0]


def test_kubernetes_says_it_once_and_the_trial_points_there(
        kube: Any, short_dir: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config(kube, short_dir, pods_service(dockerImage=SLIM_IMAGE), trialConcurrency=2)
    messages = _messages(cfg)
    _said_once(capsys, SLIM_IMAGE)
    assert all(notices.DEPS_POINTER in m for m in messages), messages


@pytest.fixture
def bare_python(short_dir: Path) -> Iterator[Path]:
    """A venv of the machine's own interpreter with nothing installed (no pip either); its bin
    directory, where the SSH user can run it. The agent's install for that Python's version is removed
    from the SSH user's home first (as tests/remote/test_shipped_deps.py does): else the worker has it already."""
    if not STOCK.exists():
        pytest.skip("no /usr/bin/python3 on this machine")
    short_dir.chmod(0o755)
    subprocess.run([str(STOCK), "-m", "venv", "--without-pip", str(short_dir / "venv")], check=True)
    yield short_dir / "venv" / "bin"


def _bare_worker(plain_sshd: Any, bare_python: Path, short_dir: Path) -> tuple[Path, Any]:
    """The trial's code folder, and the sshd machine with a bare Python whose shipped dependencies
    (from an earlier run) are removed from the SSH user's home: nothing can be shipped to it."""
    from nni_manager.backends.agent_wheel import build_agent_wheel

    tag = build_agent_wheel(short_dir / "wheel").tag
    version = subprocess.run([str(STOCK), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    shutil.rmtree(plain_sshd.home / ".nni-agent" / tag / f"deps-{version}", ignore_errors=True)
    code = short_dir / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    return code, dataclasses.replace(plain_sshd.machine, python_path=str(bare_python))


def test_remote_says_it_once_and_the_trial_points_there(
        plain_sshd: Any, bare_python: Path, short_dir: Path,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    from nni_manager.backends.remote.config import RemoteConfig
    from nni_manager.config import TrainingServiceConfig

    code, machine = _bare_worker(plain_sshd, bare_python, short_dir)
    cfg = ExperimentConfig(trial_command="python3 trial.py", trial_code_directory=code, trial_concurrency=2,
                           experiment_working_directory=short_dir / "exps",
                           training_service=TrainingServiceConfig(platform="remote", options=RemoteConfig([machine])))
    messages = _messages(cfg)
    _said_once(capsys, str(bare_python))
    assert messages and all(notices.DEPS_POINTER in m for m in messages), messages


def test_hybrid_remote_part_says_it_once_while_the_local_part_runs_the_trials(
        plain_sshd: Any, bare_python: Path, short_dir: Path,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    """Hybrid mode: its remote part (a bare Python, nothing to ship) says it on the console once,
    as the remote platform does alone; the local part runs the trials."""
    import sys

    from nni_manager.backends.remote.config import RemoteConfig
    from nni_manager.config import TrainingServiceConfig
    from nni_manager.config.hybrid import HybridOptions

    code, machine = _bare_worker(plain_sshd, bare_python, short_dir)
    cfg = ExperimentConfig(
        trial_command=f"{sys.executable} trial.py", trial_code_directory=code, trial_concurrency=2,
        experiment_working_directory=short_dir / "exps",
        training_service=TrainingServiceConfig(platform="hybrid", options=HybridOptions([
            TrainingServiceConfig(platform="local"),
            TrainingServiceConfig(platform="remote", options=RemoteConfig([machine])),
        ])))
    messages = _messages(cfg, trials=3)
    _said_once(capsys, str(bare_python))
    assert messages == [""] * 3, messages  # SUCCEEDED on the local part


def test_openpai_says_it_once_and_the_trial_points_there(
        pai_factory: Any, short_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    from tests.support.images import slim_python_dir
    from tests.support.openpai.experiments import config as pai_config

    pai = pai_factory(rate_limits={"list": 0}, images={SLIM_IMAGE: slim_python_dir(short_dir)})
    storage = pai.storage_dir("confignfs")
    cfg = pai_config(pai, short_dir, {"storageConfigName": "confignfs", "localStorageMountPoint": str(storage),
                                      "containerStorageMountPoint": "/mnt/confignfs", "dockerImage": SLIM_IMAGE},
                     trialConcurrency=2)
    messages = _messages(cfg)
    _said_once(capsys, SLIM_IMAGE)
    assert all("grpcio is missing" in m and notices.DEPS_POINTER in m for m in messages), messages


def test_aml_says_it_once_and_the_trial_points_there(
        aml_factory: Any, azurite: str, short_dir: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    from nni_manager.loader import load_config
    from tests.support.aml.datastore import code_asset_aml
    from tests.support.aml.experiments import config_dict

    aml = code_asset_aml(aml_factory, azurite, monkeypatch)
    cfg = load_config(config_dict(aml, short_dir, dockerImage=SLIM_IMAGE, blobEndpoint=azurite))
    messages = _messages(cfg)
    _said_once(capsys, SLIM_IMAGE)
    assert all(notices.DEPS_POINTER in m for m in messages), messages


@pytest.fixture(autouse=True)
def _no_wheels(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No wheel anywhere: an empty cache, no agentWheelhouse, no download."""
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(short_dir / "wheel-cache"))
    monkeypatch.setenv(agent_deps.DOWNLOAD_ENV, "0")
    monkeypatch.setattr(notices, "_said", set())
    logging.getLogger("nni_manager.console").setLevel(logging.NOTSET)
