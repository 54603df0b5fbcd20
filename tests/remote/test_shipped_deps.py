"""A worker whose Python has none of the agent's dependencies, in a network namespace that
reaches no package index: the manager resolves wheels for that Python (from
`agentWheelhouse` into its own cache) and ships them over SFTP; trials SUCCEED. A second
experiment finds them installed on the worker and ships nothing."""
from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nni_manager.backends import agent_deps
from nni_manager.backends.agent_wheel import build_agent_wheel
from nni_manager.backends.remote.config import RemoteConfig
from nni_manager.config import ExperimentConfig, TrainingServiceConfig
from nni_manager.service import create_training_service
from tests.support import trial_isolation
from tests.support.manager.helpers import TRIAL, form, wait_status
from tests.support.remote.fixtures import readable_dir
from tests.support.bounded import run_bounded

pytestmark = pytest.mark.ssh
STOCK = Path("/usr/bin/python3")
# filled by scripts/test.sh (scripts/fill_wheelhouse.py, for the stock Python) while it may use the network
WHEELHOUSE = Path(__file__).resolve().parents[2] / ".venv" / "agent-wheelhouse"
SHIPPED = "shipped %d wheels"


@pytest.fixture
def bare_python() -> Iterator[Path]:
    """A venv of the machine's own interpreter with nothing installed, where the SSH user can run
    it; yields its bin directory."""
    if not STOCK.exists():
        pytest.skip("no /usr/bin/python3 on this machine")
    if not (WHEELHOUSE / ".complete").exists():
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    root = readable_dir("nbp")
    subprocess.run([str(STOCK), "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    yield root / "venv" / "bin"
    shutil.rmtree(root, ignore_errors=True)


def _experiment(code: Path, exps: Path, machine, trials: int, command: str = "python3 trial.py") -> tuple[str, list[str]]:
    cfg = ExperimentConfig(
        trial_command=command, trial_code_directory=code, trial_concurrency=2,
        experiment_working_directory=exps, agent_wheelhouse=WHEELHOUSE,
        training_service=TrainingServiceConfig(platform="remote", options=RemoteConfig([machine])),
    )

    async def body() -> tuple[str, list[str]]:
        async with create_training_service(cfg) as ts:
            jobs = [await ts.submit_trial_job(form(i, x=i)) for i in range(trials)]
            done = [await wait_status(ts, j.id, "SUCCEEDED", "FAILED", timeout=120) for j in jobs]
            return ts.experiment_id, [f"{d.status.value} {d.message}" for d in done]

    return run_bounded(body(), 240)


def test_bare_worker_runs_trials_with_dependencies_shipped_by_the_manager(
        netns_hosts, bare_python, monkeypatch, caplog) -> None:
    bare = subprocess.run([str(bare_python / "python3"), "-c", "import grpc"], capture_output=True, text=True)
    assert bare.returncode != 0 and "No module named 'grpc'" in bare.stderr  # truly bare
    host = netns_hosts[0]
    no_index = subprocess.run(["ip", "netns", "exec", host.name, "python3", "-c",
                               "import socket; socket.create_connection(('pypi.org', 443), 3)"],
                              capture_output=True, text=True)
    assert no_index.returncode != 0  # the worker's namespace reaches no index: pip cannot help it
    short = Path(tempfile.mkdtemp(prefix="nsd", dir="/tmp"))
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(short / "cache"))  # the manager's cache starts empty
    tag = build_agent_wheel(short / "wheel").tag
    version = subprocess.run([str(STOCK), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    shutil.rmtree(host.home / ".nni-agent" / tag / f"deps-{version}", ignore_errors=True)
    code = short / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    machine = dataclasses.replace(host.machine, python_path=str(bare_python))
    caplog.set_level(logging.INFO, logger="nni_manager.backends.remote.bootstrap")
    experiments = []
    try:
        first_id, first = _experiment(code, short / "exps", machine, trials=4)
        experiments.append(first_id)
        shipped = [r for r in caplog.records if r.getMessage().startswith("shipped ")]
        assert first == ["SUCCEEDED "] * 4, first
        assert len(shipped) == 1, [r.getMessage() for r in shipped]
        n_wheels, n_bytes = shipped[0].args[0], shipped[0].args[1]
        assert n_wheels >= 4 and n_bytes > 1_000_000  # grpcio, protobuf, psutil, nvidia-ml-py (+ theirs)
        assert sorted(p.name for p in (short / "cache").rglob("*.whl"))  # kept for the next experiment
        deps = host.home / ".nni-agent" / tag / f"deps-{version}"
        assert (deps / "grpc").is_dir() and (deps / "google" / "protobuf").is_dir() and (deps / "psutil").is_dir()
        assert not list((host.home / ".nni-agent" / tag).glob(".wheels-*"))  # the upload was unpacked and removed

        caplog.clear()
        second_id, second = _experiment(code, short / "exps", machine, trials=1)
        experiments.append(second_id)
        assert second == ["SUCCEEDED "]
        assert not [r for r in caplog.records if r.getMessage().startswith("shipped ")]  # installed: no upload
    finally:
        for exp in experiments:
            shutil.rmtree(host.home / "nni-experiments" / exp, ignore_errors=True)
            shutil.rmtree(host.home / ".nni-agent" / "run" / exp, ignore_errors=True)
        shutil.rmtree(short, ignore_errors=True)


def test_trials_import_the_workers_old_protobuf_while_the_agent_runs_with_its_shipped_one(
        netns_hosts, bare_python, monkeypatch) -> None:
    """The worker's Python has protobuf 3.19 (NNI's default image's) and nothing else: the agent runs
    with the protobuf the manager shipped; the trial (that Python, an old-style `_pb2` module) sees
    none of the agent's path and SUCCEEDS (tests/support/trial_isolation.py)."""
    (site,) = bare_python.parent.glob("lib/python3.*/site-packages")
    trial_isolation.give_old_protobuf(site)
    short = readable_dir("nsi")  # the trial runs by its path there, as the SSH user
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(short / "cache"))
    trial = trial_isolation.write_trial(short / "code")
    machine = dataclasses.replace(netns_hosts[0].machine, python_path=str(bare_python))
    exp = ""
    try:
        exp, results = _experiment(short / "code", short / "exps", machine, trials=1, command=f"python3 {trial}")
        assert results == ["SUCCEEDED "], results
    finally:
        if exp:
            shutil.rmtree(netns_hosts[0].home / "nni-experiments" / exp, ignore_errors=True)
            shutil.rmtree(netns_hosts[0].home / ".nni-agent" / "run" / exp, ignore_errors=True)
        shutil.rmtree(short, ignore_errors=True)
