"""Running the suite on xdist workers (tests/support/parallel.py, scripts/test.sh)."""
from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.parallel import (
    GROUPS_ENV,
    HOME_OWNER_ENV,
    ONE_WORKER,
    group_items,
    is_worker,
    make_scheduler,
    owns_home,
    restore_home,
    slow_first,
    snapshot_home,
    write_groups,
)

ROOT = Path(__file__).resolve().parents[1]


class FakeItem:
    def __init__(self, *fixtures: str, nodeid: str = "") -> None:
        self.fixturenames = list(fixtures)
        self.markers: list[Any] = []
        self.nodeid = nodeid

    def add_marker(self, marker: Any) -> None:
        self.markers.append(marker)

    def get_closest_marker(self, name: str) -> Any:
        return next((m.mark for m in self.markers if m.mark.name == name), None)


def groups(item: FakeItem) -> list[str]:
    return [m.mark.args[0] for m in item.markers if m.mark.name == "xdist_group"]


def test_tests_sharing_a_machine_wide_resource_go_to_one_group() -> None:
    """Slurm and a root SSH login share root's home; the other SSH tests log in as their worker's
    own user (tests/support/remote/fixtures.py: ssh_user) and go to any worker."""
    items = [FakeItem("slurm", "base"), FakeItem("login_node", "slurm"), FakeItem("root_login", "netns_hosts"),
             FakeItem("plain_sshd", "ssh_user", "short_dir"), FakeItem("netns_hosts", "ssh_user"),
             FakeItem("password_user", "ssh_keys"), FakeItem("kube_ns"), FakeItem("tmp_path")]
    group_items(items)  # type: ignore[arg-type]
    assert [groups(i) for i in items] == [["root-home"]] * 3 + [[]] * 5
    assert set(ONE_WORKER.values()) == {"root-home"}


def test_a_parameter_that_picks_a_grouped_fixture_at_run_time_carries_its_group() -> None:
    """tests/platforms' `job_platform` param for Slurm gets the Slurm fixture by getfixturevalue: its
    name is not among the test's fixtures, the param's xdist_group mark says the group."""
    from tests.support.parallel import group_of

    param = FakeItem("job_platform", nodeid="tests/platforms/test_job_contract.py::test_x[slurm]")
    param.add_marker(pytest.mark.xdist_group("root-home"))
    assert group_of(param) == "root-home"  # type: ignore[arg-type]
    assert group_of(FakeItem("job_platform")) is None  # type: ignore[arg-type]


def test_slow_tests_go_first_and_the_rest_keep_their_order() -> None:
    """The workers ask for tests in collection order: the longest first leaves short ones for the end."""
    items = [FakeItem(nodeid=n) for n in ("a", "b", "c", "d", "e")]
    for slow in (items[1], items[4]):
        slow.add_marker(pytest.mark.slow)
    slow_first(items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == ["b", "e", "a", "c", "d"]


def test_the_controller_schedules_the_groups_the_workers_collected(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """xdist's own loadgroup does not group under pytest 9.2 (tests/support/parallel.py): ours does."""
    monkeypatch.setenv(GROUPS_ENV, str(tmp_path / "groups.json"))
    worker = SimpleNamespace(workerinput={"workerid": "gw0"})
    items = [FakeItem("slurm", nodeid="tests/slurm/test_a.py::test_x"), FakeItem("tmp_path", nodeid="tests/t.py::test_y"),
             FakeItem("root_login", nodeid="tests/remote/test_b.py::test_z[1]")]
    write_groups(worker, items)  # type: ignore[arg-type]
    options = {"dist": "loadgroup", "tx": ["2*popen"]}
    controller = SimpleNamespace(getoption=lambda name, default=None: options.get(name, default),
                                 getvalue=options.get, option=SimpleNamespace(loadscopereorder=True))
    scheduler: Any = make_scheduler(controller, None)  # type: ignore[arg-type]
    scopes = [scheduler._split_scope(i.nodeid) for i in items]
    assert scopes == ["group:root-home", "tests/t.py::test_y", "group:root-home"]
    options["dist"] = "load"
    assert make_scheduler(controller, None) is None  # type: ignore[arg-type]


def test_only_the_controller_or_a_plain_run_cleans_the_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not is_worker(SimpleNamespace())  # type: ignore[arg-type]
    assert is_worker(SimpleNamespace(workerinput={"workerid": "gw0"}))  # type: ignore[arg-type]
    # the outermost pytest owns it; a worker does not, nor does a pytest that a test starts (it inherits the mark)
    monkeypatch.delenv(HOME_OWNER_ENV, raising=False)
    assert not owns_home(SimpleNamespace(workerinput={"workerid": "gw0"}))  # type: ignore[arg-type]
    assert owns_home(SimpleNamespace())  # type: ignore[arg-type]
    assert os.environ[HOME_OWNER_ENV] == str(os.getpid())
    assert not owns_home(SimpleNamespace())  # type: ignore[arg-type]
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "nni-experiments" / "kept").mkdir(parents=True)
    before = snapshot_home()
    (tmp_path / "nni-experiments" / "made").mkdir()
    (tmp_path / ".nni-agent" / "run" / "exp1").mkdir(parents=True)
    restore_home(before)
    assert sorted(p.name for p in (tmp_path / "nni-experiments").iterdir()) == ["kept"]
    assert not (tmp_path / ".nni-agent").exists()  # it was not there before


def test_the_ci_command_runs_workers_with_groups_and_an_override() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "workers=${NNI_TEST_WORKERS:-" in script
    [call] = [line for line in script.splitlines() if re.match(r"python -m pytest ", line)]
    assert '-n "$workers" --dist loadgroup' in call and "--durations=25" in call and "--basetemp" in call
    assert "pytest-xdist" in (ROOT / "pyproject.toml").read_text()


CRASH_CONFTEST = """
import sys
sys.path.insert(0, {root!r})
import pytest
from tests.support.parallel import end_groups, group_items, make_scheduler, start_groups, write_groups

def pytest_configure(config): start_groups(config)
def pytest_unconfigure(config): end_groups(config)
def pytest_itemcollected(item): group_items([item])
def pytest_collection_modifyitems(config, items): write_groups(config, items)
def pytest_xdist_make_scheduler(config, log): return make_scheduler(config, log)

@pytest.fixture
def root_login():  # a fixture of ONE_WORKER: its tests are one group
    return None
"""

CRASH_TESTS = """
import ctypes, os, time
import pytest

@pytest.mark.parametrize("i", range(30))
def test_plain(i):
    time.sleep(0.02)
    if i == 25 and os.environ.get("PYTEST_XDIST_WORKER"):
        ctypes.string_at(0)  # a segfault, as a C extension's can be

@pytest.mark.parametrize("i", range(8))
def test_grouped(i, root_login):
    time.sleep(0.02)
"""


def test_a_crashed_worker_fails_its_test_and_the_run_still_ends(tmp_path: Path) -> None:
    """A worker that dies (a segfault in a C extension, seen in a full run) is replaced, its test is
    reported failed, and every other test still runs: xdist 3.8's loadgroup queued the crashed
    worker's finished units again and hung the run for good."""
    import subprocess
    import sys

    (tmp_path / "conftest.py").write_text(CRASH_CONFTEST.format(root=str(ROOT)))
    (tmp_path / "test_crash.py").write_text(CRASH_TESTS)
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3",
                              "--dist", "loadgroup", "-o", "faulthandler_timeout=0", str(tmp_path)],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the run hung after the worker crashed: {(e.stdout or b'')[-2000:]!r}")
    summary = run.stdout.strip().splitlines()[-1]
    assert "crashed while running 'test_crash.py::test_plain[25]'" in run.stdout, run.stdout[-3000:]
    assert re.search(r"\b1 failed, 37 passed\b", summary), run.stdout[-3000:]
