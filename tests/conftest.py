"""Suite-wide settings: loopback only, and trials that run the tests' own Python."""
import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# gRPC honours http_proxy; tests talk to 127.0.0.1 only and must never go through a proxy.
for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy"):
    os.environ.pop(var, None)
os.environ["no_proxy"] = os.environ["NO_PROXY"] = "127.0.0.1,localhost,::1"

# The manager may `pip download` the agent's dependencies for a bare worker: never from a test
# (loopback only), and never into the user's own wheel cache.
os.environ["NNI_AGENT_WHEEL_DOWNLOAD"] = "0"
os.environ["NNI_AGENT_WHEEL_CACHE"] = tempfile.mkdtemp(prefix="nni-wheel-cache-")
atexit.register(shutil.rmtree, os.environ["NNI_AGENT_WHEEL_CACHE"], ignore_errors=True)  # this process's own

# Random and GridSearch run in the manager (nni_manager/dispatcher/__init__.py) unless a test's
# subject is NNI's dispatcher (those delete this): NNI's dispatcher process imports nni (2.7 s of
# CPU: scipy, pandas) and takes up to 3 s to exit, for every experiment. NNI's other algorithms,
# assessors and className tuners still run in NNI's dispatcher.
os.environ.setdefault("NNI_MANAGER_BUILTIN_TUNERS", "1")

# Trial commands such as `python train.py` (NNI's usual form) must find the interpreter that
# has this package installed, as they would in a user's activated virtual environment.
_bin = os.path.dirname(sys.executable)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _bin:
    os.environ["PATH"] = _bin + os.pathsep + os.environ.get("PATH", "")


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short temporary directory: the hub's Unix socket lives in the experiment directory,
    and Unix socket paths are limited to 107 bytes."""
    d = Path(tempfile.mkdtemp(prefix="nm", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def code_dir(short_dir: Path) -> Path:
    """A trial code directory holding tests.support.manager.helpers.TRIAL as trial.py."""
    from tests.support.manager.helpers import TRIAL

    code = short_dir / "code"
    code.mkdir()
    (code / "trial.py").write_text(TRIAL)
    return code


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`system` on every test that starts a process, a server or an emulator (tests/support/system_marker.py);
    the `slow` tests first (tests/support/parallel.py: slow_first)."""
    from tests.support.parallel import slow_first, write_groups
    from tests.support.system_marker import mark_system

    mark_system(items)
    slow_first(items)
    write_groups(config, items)


def pytest_deselected(items: list[pytest.Item]) -> None:
    from tests.support.system_marker import note_deselected

    note_deselected(items)


def pytest_itemcollected(item: pytest.Item) -> None:
    """xdist's `xdist_group` marker on the suite's groups (tests/support/parallel.py), set as each test is
    collected: an xdist whose loadgroup works reads it in its own pytest_collection_modifyitems."""
    from tests.support.parallel import group_items

    group_items([item])


_HOME = pytest.StashKey[dict]()  # tests/support/parallel.py: HomeSnapshot


def pytest_configure(config: pytest.Config) -> None:
    """The outermost pytest (the controller under xdist; not a worker, nor a pytest a test starts) owns the
    cleanup of root's home (tests/support/parallel.py: owns_home)."""
    from tests.support.parallel import owns_home, snapshot_home, start_groups

    if owns_home(config):
        config.stash[_HOME] = snapshot_home()
    start_groups(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    from tests.support.parallel import HOME_OWNER_ENV, end_groups, restore_home

    end_groups(config)
    before = config.stash.get(_HOME, None)
    if before is not None:
        restore_home(before)
        os.environ.pop(HOME_OWNER_ENV, None)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: none without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadgroup` with the suite's groups (tests/support/parallel.py)."""
    from tests.support.parallel import make_scheduler

    return make_scheduler(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    outcome = yield
    _skip_without_schemas(outcome)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    outcome = yield
    _skip_without_schemas(outcome)


def _skip_without_schemas(outcome) -> None:  # noqa: ANN001 (pluggy's Result)
    """A test or fixture that needs the published schemas (kept outside the project, normally
    ../shared/schemas) is skipped with the reason where they are absent, as on a fresh clone."""
    from tests.support.schemas import SchemasMissing

    if outcome.excinfo is not None and isinstance(outcome.excinfo[1], SchemasMissing):
        outcome.force_exception(pytest.skip.Exception(str(outcome.excinfo[1]), _use_item_location=True))
