"""A worker's own Python for trials that need packages (optuna, say): a venv of the machine's
/usr/bin/python3 whose site-packages sees only the named distributions of the test's venv (and
what they require), linked in as an image's or a cluster module's packages would be. Not the
manager's interpreter, so a trial that ran under the manager's Python is told apart; the agent's
own dependencies are not added (the manager ships them where they are missing)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

STOCK = Path("/usr/bin/python3")


def requirements_closure(roots: list[str]) -> set[str]:
    """The distributions `roots` need, transitively, without extras (roots included)."""
    from packaging.requirements import Requirement

    wanted: set[str] = set()
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = req.name.lower().replace("_", "-")
        if name not in wanted:
            wanted.add(name)
            todo.extend(Requirement(r) for r in metadata.requires(name) or [])
    return wanted


def link_distributions(names: set[str], into: Path) -> None:
    """Symlink each distribution's top-level entries (packages, modules, .dist-info) into `into`."""
    for name in names:
        dist = metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops - {"__pycache__", "bin"}:
            src = Path(str(dist.locate_file(top)))
            if src.exists() and not (into / top).exists():
                (into / top).symlink_to(src)


def make_worker_python(root: Path, packages: list[str]) -> Path:
    """A venv of /usr/bin/python3 under `root` with `packages` (and theirs) on its path; its bin
    directory (a remote machine's pythonPath). Skips where that Python is missing or of another
    minor version than the test's (whose compiled packages it borrows)."""
    if not STOCK.exists():
        pytest.skip("no /usr/bin/python3 on this machine")
    version = subprocess.run([str(STOCK), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    if version != "%d.%d" % sys.version_info[:2]:
        pytest.skip(f"/usr/bin/python3 is {version}: the test's compiled packages are for another version")
    subprocess.run([str(STOCK), "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    deps = root / "deps"
    deps.mkdir()
    link_distributions(requirements_closure(packages), deps)
    (site,) = (root / "venv" / "lib").glob("python3*/site-packages")
    (site / "worker-packages.pth").write_text(f"{deps}\n")
    return root / "venv" / "bin"


# filled by scripts/test.sh (scripts/fill_wheelhouse.py): the agent's dependencies for a worker's Python
WHEELHOUSE = Path(__file__).resolve().parents[2] / ".venv" / "agent-wheelhouse"


@pytest.fixture(scope="module")
def optuna_bin() -> Iterator[Path]:
    """A worker's Python with optuna, its bin directory (a machine's pythonPath); the agent's
    dependencies come from the wheelhouse, as a bare worker's would."""
    if not (WHEELHOUSE / ".complete").exists():
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: scripts/test.sh fills it (scripts/fill_wheelhouse.py)")
    root = Path(tempfile.mkdtemp(prefix="nop", dir="/tmp"))
    root.chmod(0o755)  # the SSH tests' user runs it (tmp_path_factory's folders are root's own)
    # the wheels the manager takes from the wheelhouse stay in a cache of this module's own: in the
    # session's cache (tests/conftest.py) they would make later "nothing to ship" workers usable
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NNI_AGENT_WHEEL_CACHE", str(root / "wheel-cache"))
        yield make_worker_python(root, ["optuna", "grpcio", "protobuf"])
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def optuna_bin_as_root(optuna_bin: Path) -> Iterator[Path]:
    """`optuna_bin` for a worker that runs as root on this machine (Slurm's nodes): what the manager
    ships to root's home for it goes with it, as later root-home tests (a bare worker that must fail,
    Slurm's) need it absent. Only tests of the root-home group use it (tests/support/parallel.py): a
    worker elsewhere would delete what a root-home test running meanwhile just shipped."""
    shipped = set(Path.home().glob(".nni-agent/*/deps-*"))
    yield optuna_bin
    for deps in set(Path.home().glob(".nni-agent/*/deps-*")) - shipped:
        shutil.rmtree(deps, ignore_errors=True)
