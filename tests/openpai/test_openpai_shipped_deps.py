"""The agent's dependencies reach a bare-Python OpenPAI image through the job's storage (issue 19, item 3).

With `storageConfigName`, `localStorageMountPoint` (the storage as the manager's machine mounts
it) and `containerStorageMountPoint` (where PAI's storage plugin mounts it in the container), the
manager copies the agent wheel and the dependency wheels for each CPython into
`<local>/nni-agent/` (named for their content) and the job's boot step unpacks its own Python's
wheels from `<container>/nni-agent/deps-<hash>/cpXY/`. The image `python:3.11-slim` of the
emulator is the system Python alone (no grpcio, protobuf, psutil, nor the test's environment).
A second experiment copies nothing."""
from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
import yaml

from nni_manager.backends import agent_deps
from nni_manager.service import create_training_service
from tests.support import trial_isolation
from tests.support.images import SLIM_IMAGE, slim_python_dir
from tests.support.manager.helpers import form, wait_status
from tests.support.openpai.experiments import base, config, ours, run  # noqa: F401 (base: a fixture)

T = 90.0
WHEELHOUSE = Path(__file__).resolve().parents[2] / ".venv" / "agent-wheelhouse"  # scripts/test.sh fills it



def _tree(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def test_bare_image_runs_trials_with_dependencies_shipped_through_the_storage(pai_factory, base: Path,
                                                                              monkeypatch) -> None:
    if not any(WHEELHOUSE.glob("grpcio-*cp311*.whl")):
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(base / "wheel-cache"))  # this test's own cache
    pai = pai_factory(rate_limits={"list": 0}, images={SLIM_IMAGE: slim_python_dir(base)})
    storage = pai.storage_dir("confignfs")
    cfg = config(pai, base, {"storageConfigName": "confignfs", "localStorageMountPoint": str(storage),
                             "containerStorageMountPoint": "/mnt/confignfs", "dockerImage": SLIM_IMAGE},
                 agentWheelhouse=str(WHEELHOUSE), trialConcurrency=2)

    async def experiment() -> tuple[str, int]:
        async with create_training_service(cfg) as ts:
            trials = [await ts.submit_trial_job(form(i, x=i, steps=1)) for i in range(3)]
            for t in trials:
                d = await wait_status(ts, t.id, "SUCCEEDED", "FAILED", timeout=T)
                assert d.status.value == "SUCCEEDED", d.message
            return ts.experiment_id, ts.core.backend.shipped_bytes

    first, copied = run(experiment())
    deps = list((storage / "nni-agent").glob("deps-*/cp311/grpcio-*.whl.000"))
    assert len(deps) == 1, list((storage / "nni-agent").rglob("*"))
    assert copied > 1024 * 1024  # grpcio alone is several MB
    tree = _tree(storage / "nni-agent")
    # the job's command names the container's path, PAI's mount of the storage
    job = ours(pai, first)[0]
    url = f"{pai.api}/jobs/{pai.username}~{job['name']}/config"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {pai.token}"})
    commands = yaml.safe_load(urllib.request.urlopen(req, timeout=30).read())["taskRoles"]["taskrole"]["commands"]
    assert any("/mnt/confignfs/nni-agent/deps-" in c for c in commands), commands

    second, copied = run(experiment())
    assert copied == 0 and _tree(storage / "nni-agent") == tree  # nothing copied, nothing touched


def test_trials_import_the_images_old_protobuf_while_the_agent_runs_with_its_shipped_one(
        pai_factory, base: Path, monkeypatch) -> None:
    """The image's Python has protobuf 3.19 (on its PYTHONPATH, `agentEnv`) and nothing else: the
    agent runs with the protobuf shipped through the storage; the trial (the image's Python, an
    old-style `_pb2` module) sees none of the agent's path and SUCCEEDS (tests/support/trial_isolation.py)."""
    if not any(WHEELHOUSE.glob("grpcio-*cp311*.whl")):
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    old = trial_isolation.old_protobuf()
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(base / "wheel-cache"))
    pai = pai_factory(rate_limits={"list": 0}, images={SLIM_IMAGE: slim_python_dir(base)})
    storage = pai.storage_dir("confignfs")
    trial = trial_isolation.write_trial(base / "isolation-code")
    cfg = config(pai, base, {"storageConfigName": "confignfs", "localStorageMountPoint": str(storage),
                             "containerStorageMountPoint": "/mnt/confignfs", "dockerImage": SLIM_IMAGE,
                             "agentEnv": {"PYTHONPATH": str(old)}},
                 agentWheelhouse=str(WHEELHOUSE), trialCodeDirectory=str(base / "isolation-code"),
                 trialCommand=f"python3 {trial}")

    async def experiment() -> None:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "SUCCEEDED", "FAILED", timeout=T)
            assert d.status.value == "SUCCEEDED", d.message

    run(experiment())
    assert list((storage / "nni-agent").glob("deps-*/cp311/protobuf-*.whl.000"))  # the agent had its own
