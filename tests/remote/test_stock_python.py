"""A worker whose Python is the machine's own /usr/bin/python3 (Debian 12: 3.11.2, whose tarfile
has no PEP 706 filter): the agent installs, unpacks the trial's code bundle and the trial
SUCCEEDS. The agent's dependencies are on that Python's path through a .pth file, as a
distribution's python3-grpcio / python3-psutil packages would put them."""
from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nni_manager.backends.remote.config import RemoteConfig
from nni_manager.config import ExperimentConfig, TrainingServiceConfig
from nni_manager.service import create_training_service
from tests.support.manager.helpers import TRIAL, form, wait_status
from tests.support.remote.fixtures import readable_dir
from tests.support.worker_python import link_distributions, requirements_closure
from tests.support.bounded import run_bounded

pytestmark = pytest.mark.ssh
STOCK = Path("/usr/bin/python3")


def _agent_dependencies() -> set[str]:
    """The installed distributions the agent needs: nni-agent's requirements without extras,
    and theirs, transitively (grpcio brings typing-extensions, for one)."""
    from importlib import metadata

    return requirements_closure(metadata.requires("nni-agent") or [])


@pytest.fixture
def stock_python() -> Iterator[Path]:
    """A venv of the machine's own interpreter (its stdlib, its tarfile) with only the agent's
    dependencies on its path, where the SSH user can run it; yields the venv's bin directory (a pythonPath)."""
    if not STOCK.exists():
        pytest.skip("no /usr/bin/python3 on this machine")
    version = subprocess.run([str(STOCK), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    if version != "%d.%d" % sys.version_info[:2]:
        pytest.skip(f"/usr/bin/python3 is {version}: the test's compiled dependencies are for another version")
    root = readable_dir("nst")
    subprocess.run([str(STOCK), "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    deps = root / "deps"
    deps.mkdir()
    link_distributions(_agent_dependencies(), deps)
    venv_site = next((root / "venv" / "lib").glob("python3*/site-packages"))
    (venv_site / "agent-deps.pth").write_text(f"{deps}\n")
    yield root / "venv" / "bin"
    shutil.rmtree(root, ignore_errors=True)


def test_trial_with_code_bundle_succeeds_on_the_stock_python(plain_sshd, stock_python) -> None:
    probe = subprocess.run([str(stock_python / "python3"), "-c",
                            "import sys, grpc, google.protobuf, psutil; print(sys.version)"],
                           capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr  # the dependencies import under the stock interpreter
    stock_version = probe.stdout.strip()
    short = Path(tempfile.mkdtemp(prefix="nsp", dir="/tmp"))
    code = short / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "trial.py").write_text("import sys\nsys.path.insert(0, 'pkg')\nimport helper\nprint('helper', helper.VALUE)\n" + TRIAL)
    (code / "pkg" / "helper.py").write_text("VALUE = 7\n")
    (code / "check.sh").write_text("#!/bin/sh\nexit 0\n")
    (code / "check.sh").chmod(0o755)
    cfg = ExperimentConfig(
        trial_command="./check.sh && python3 -c 'import sys; print(sys.version)' && python3 trial.py",
        trial_code_directory=code, trial_concurrency=1, experiment_working_directory=short / "exps",
        training_service=TrainingServiceConfig(platform="remote", options=RemoteConfig(
            [dataclasses.replace(plain_sshd.machine, python_path=str(stock_python))])),
    )

    async def body() -> tuple[str, str]:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0, x=5))
            done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", timeout=90)
            assert done.status.value == "SUCCEEDED", done.message
            return ts.experiment_id, str(await ts.get_trial_file(done.id, "trial.stdout"))

    try:
        experiment_id, stdout = run_bounded(body(), 150)
    finally:
        shutil.rmtree(short, ignore_errors=True)
    lines = stdout.splitlines()
    assert lines[0] == stock_version.splitlines()[0]  # the trial ran under the stock interpreter
    assert "helper 7" in lines and "params {'x': 5}" in stdout  # the bundle's files arrived whole
    shutil.rmtree(plain_sshd.home / "nni-experiments" / experiment_id, ignore_errors=True)
    shutil.rmtree(plain_sshd.home / ".nni-agent" / "run" / experiment_id, ignore_errors=True)
