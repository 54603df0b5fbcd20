"""The compute nodes' Python lacks the agent's dependencies: the manager ships them through the
shared file system (backends/slurm/deps.py), on a real Slurm cluster.

`pythonPath` is a bare venv of the machine's own Python (no grpcio, protobuf, psutil, no pip):
the manager checks it once with the boot step's `--check` where the Slurm commands run, resolves
wheels for it (from `agentWheelhouse` into its own cache; never `pip download` here) and puts them
under `<experiments dir>/agent-deps/`; trials SUCCEED, and a second experiment ships nothing. A
Python whose grpcio is too old, with nothing to ship, fails its trial with the boot step's line."""
from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nni_manager import notices
from nni_manager.backends import agent_deps
from nni_manager.backends.slurm import deps
from nni_manager.backends.slurm.hosts import LocalHost
from nni_manager.service import create_training_service
from tests.support import trial_isolation
from tests.support.manager.helpers import form, wait_status
from tests.support.slurm.experiments import T, assert_clean, config, run

STOCK = Path("/usr/bin/python3")
# filled by scripts/test.sh (scripts/fill_wheelhouse.py, for the stock Python) while it may use the network
WHEELHOUSE = Path(__file__).resolve().parents[2] / ".venv" / "agent-wheelhouse"
DEPS_LOGGER = "nni_manager.backends.slurm.deps"


def _venv(root: Path) -> Path:
    subprocess.run([str(STOCK), "-m", "venv", "--without-pip", str(root)], check=True)
    return root / "bin" / "python3"


@pytest.fixture
def bare_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A venv of the machine's own interpreter with nothing installed (its python3); the manager's
    wheel cache starts empty and never downloads: the wheels come from the wheelhouse."""
    if not STOCK.exists():
        pytest.skip("no /usr/bin/python3 on this machine")
    if not (WHEELHOUSE / ".complete").exists():
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(agent_deps.DOWNLOAD_ENV, "0")
    python = _venv(tmp_path / "bare")
    bare = subprocess.run([str(python), "-c", "import grpc"], capture_output=True, text=True)
    assert bare.returncode != 0 and "No module named 'grpc'" in bare.stderr  # truly bare
    yield python


def _trials(cfg: Any, n: int) -> tuple[str, list[str]]:
    async def main() -> tuple[str, list[str]]:
        async with create_training_service(cfg) as ts:
            jobs = [await ts.submit_trial_job(form(i, x=i)) for i in range(n)]
            done = [await wait_status(ts, j.id, "SUCCEEDED", "FAILED", timeout=T) for j in jobs]
            return ts.experiment_id, [f"{d.status.value} {d.message}" for d in done]

    return run(main())


def _shipped(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == DEPS_LOGGER and r.getMessage().startswith("shipped ")]


def test_bare_python_runs_trials_with_dependencies_shipped_through_the_shared_fs(
        slurm, base: Path, bare_python: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=DEPS_LOGGER)
    ts = {"pythonPath": str(bare_python), "reuseMode": False}
    first, results = _trials(config(base, ts, trialCommand=f"{sys.executable} trial.py",
                                    agentWheelhouse=str(WHEELHOUSE)), 2)
    assert results == ["SUCCEEDED "] * 2, results
    shipped = _shipped(caplog)
    assert len(shipped) == 1, [r.getMessage() for r in shipped]
    n_wheels, n_bytes, where = shipped[0].args[0], shipped[0].args[1], Path(shipped[0].args[2])
    assert n_wheels >= 4 and n_bytes > 1_000_000  # grpcio, protobuf, psutil, nvidia-ml-py (+ theirs)
    assert where.parent.parent == base / "exps" / "agent-deps"  # beside the experiments, not inside one
    assert sorted(p.name for p in where.iterdir()) and all(p.name.endswith(".whl.000") for p in where.iterdir())
    lib = where.parent / "lib"  # unpacked once by the jobs' boot step
    assert (lib / "grpc").is_dir() and (lib / "google" / "protobuf").is_dir() and (lib / "psutil").is_dir()
    assert not list(where.parent.glob(".wheels-*"))  # the upload's temporary directory is gone
    assert_clean(slurm, first)

    caplog.clear()
    second, results = _trials(config(base, ts, trialCommand=f"{sys.executable} trial.py",
                                     agentWheelhouse=str(WHEELHOUSE)), 1)
    assert results == ["SUCCEEDED "], results
    assert not _shipped(caplog)  # the first experiment's wheels are reused: nothing uploaded
    assert any("already at" in r.getMessage() for r in caplog.records if r.name == DEPS_LOGGER)
    assert_clean(slurm, second)


def test_trials_import_the_workers_old_protobuf_while_the_agent_runs_with_its_shipped_one(
        slurm, base: Path, bare_python: Path) -> None:
    """The compute nodes' Python has protobuf 3.19 (NNI's default image's) and nothing else: the
    manager ships grpcio, protobuf 5+ and psutil for the agent; the trial (that Python, an old-style
    `_pb2` module) sees none of them and SUCCEEDS (tests/support/trial_isolation.py)."""
    (site,) = bare_python.parent.parent.glob("lib/python3.*/site-packages")
    trial_isolation.give_old_protobuf(site)
    cfg = config(base, {"pythonPath": str(bare_python), "reuseMode": False}, agentWheelhouse=str(WHEELHOUSE))
    trial = trial_isolation.write_trial(Path(cfg.trial_code_directory))
    cfg = config(base, {"pythonPath": str(bare_python), "reuseMode": False}, agentWheelhouse=str(WHEELHOUSE),
                 trialCommand=f"{bare_python} {trial}")
    exp, results = _trials(cfg, 1)
    assert results == ["SUCCEEDED "], results
    libs = list((base / "exps" / "agent-deps").glob("deps-*/lib"))
    assert any((lib / "google" / "protobuf").is_dir() for lib in libs), libs  # the agent had its own
    assert_clean(slurm, exp)


def test_bare_python_through_the_login_node_gets_dependencies_by_sftp(
        slurm, login_node, base: Path, bare_python: Path, caplog: pytest.LogCaptureFixture) -> None:
    """loginNode: the check runs on the login node over SSH and the wheels go there by SFTP
    (into ~/nni-experiments/agent-deps, which the compute nodes see); a second experiment finds
    them there and uploads nothing."""
    caplog.set_level(logging.INFO, logger=DEPS_LOGGER)
    login = dict(login_node.spec)
    cfg = config(base, {"loginNode": login, "pythonPath": str(bare_python), "reuseMode": False},
                 trialCommand=f"{sys.executable} trial.py", agentWheelhouse=str(WHEELHOUSE))
    exp, results = _trials(cfg, 1)
    assert results == ["SUCCEEDED "], results
    libs = list((login_node.home / "nni-experiments" / "agent-deps").glob("deps-*/lib"))
    assert any((lib / "grpc").is_dir() for lib in libs), libs
    assert_clean(slurm, exp)

    caplog.clear()
    exp, results = _trials(cfg, 1)
    assert results == ["SUCCEEDED "], results
    assert not _shipped(caplog)
    assert_clean(slurm, exp)


# ----------------------------------------------------------------------------- without a cluster

def test_a_python_that_does_not_run_there_ships_nothing(tmp_path: Path, caplog) -> None:
    """The check cannot run (no such pythonPath where the Slurm commands run): nothing is shipped,
    with a warning; the compute nodes' boot step says what is wrong."""
    caplog.set_level(logging.WARNING, logger=DEPS_LOGGER)
    got = asyncio.run(deps.ship(LocalHost(tmp_path), str(tmp_path / "no" / "python3"), str(tmp_path), WHEELHOUSE))
    assert got is None
    assert any("cannot check" in r.getMessage() and "nothing shipped" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / deps.DEPS_DIR).exists()


def test_two_managers_shipping_at_once_leave_one_complete_directory(
        tmp_path: Path, bare_python: Path, caplog) -> None:
    """Two experiments starting together: both get the same directory; what each copied lands
    whole or not at all (renamed into place), and no temporary directory is left."""
    caplog.set_level(logging.INFO, logger=DEPS_LOGGER)
    host = LocalHost(tmp_path)

    async def both() -> list[deps.Shipped | None]:
        return list(await asyncio.gather(*(deps.ship(host, str(bare_python), str(tmp_path), WHEELHOUSE)
                                           for _ in range(2))))

    a, b = asyncio.run(both())
    assert a is not None and a == b
    wheels = sorted(p.name for p in Path(a.wheels).iterdir())
    assert len(wheels) >= 4 and all(w.endswith(".whl.000") for w in wheels)
    assert sorted(w[:-4] for w in wheels) == sorted(p.name for p in WHEELHOUSE.glob("*.whl"))
    assert not list(Path(a.wheels).parent.glob(".wheels-*"))
    assert len(_shipped(caplog)) == 1  # both may copy, but one rename wins; the other's copy is dropped


def test_too_old_grpcio_with_nothing_to_ship_fails_with_the_boot_steps_line(
        slurm, base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """grpcio imports but its metadata says 1.30.0; no wheelhouse, an empty cache, no download:
    nothing can be shipped, and the trial says what is wrong in the boot step's words."""
    if not STOCK.exists() or sys.version_info[:2] != tuple(int(x) for x in subprocess.run(
            [str(STOCK), "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
            capture_output=True, text=True, check=True).stdout.split()):
        pytest.skip("needs /usr/bin/python3 of this Python's minor (it borrows this venv's grpcio)")
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(agent_deps.DOWNLOAD_ENV, "0")
    python = _venv(tmp_path / "old")
    (site,) = (tmp_path / "old").glob("lib/python3.*/site-packages")
    real = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "grpc").is_dir())
    (site / "real.pth").write_text(real + "\n")  # the real grpcio, protobuf, psutil ...
    info = site / "grpcio-1.30.0.dist-info"  # ... but the first metadata found says 1.30.0
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: grpcio\nVersion: 1.30.0\n")
    caplog.set_level(logging.WARNING, logger=DEPS_LOGGER)
    cfg = config(base, {"pythonPath": str(python), "reuseMode": False})

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "FAILED", timeout=T)
            assert "nni-agent: Python " in d.message and "of the compute node cannot run the agent: grpcio 1.30.0 " \
                "is older than 1.49.1" in d.message, d.message
            assert f"fix: {python} -m pip install 'grpcio>=1.49.1,<2'" in d.message, d.message
            assert notices.DEPS_POINTER in d.message, d.message  # the console says how to ship them
            return ts.experiment_id

    exp = run(main())
    warned = [r.getMessage() for r in caplog.records if r.name in (DEPS_LOGGER, "nni_manager.console")]
    assert any("cannot ship the agent's dependencies" in w and "agentWheelhouse" in w for w in warned), warned
    assert not (base / "exps" / "agent-deps").exists()  # nothing shipped
    assert_clean(slurm, exp)
