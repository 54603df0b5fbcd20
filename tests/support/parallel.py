"""What the suite needs to run on several pytest-xdist workers at once (scripts/test.sh runs
`-n N --dist loadgroup`; docs/testing.md).

Each worker is its own pytest process with its own session fixtures, so every session resource
is made per worker with a unique name (network namespaces, sshd ports and dirs, emulators, temp
dirs, and the SSH tests' login user: tests/support/remote/fixtures.py `ssh_user`, with its own
home, so its agents, the dependencies shipped to `~/.nni-agent/<tag>/deps-<py>` and its experiment
dirs are that worker's alone, and its session removes user and home). What runs as root on the
worker side cannot be made per worker, and is handled here:

* Slurm: its nodes and login node run as root, so its jobs' agents live in root's real home, and
  the tests count the loginNode relays running on the machine (`relay_processes`); one real
  cluster (munged, slurmctld, two slurmd) is enough.
* `root_login`: SSH tests that need root on the worker: tests/remote/test_shared_storage_remote.py,
  whose worker mounts NFS itself (NNI: with passwordless sudo, which this machine lacks) or writes
  to a bind mount standing for blobfuse2's (NNI mounts it with sudo and `allow_other`; a bind
  mount of root's folder is not writable by another user). Their agents live in root's home too,
  beside Slurm's jobs: dependencies one of them ships there make another's bare Python usable
  (test_slurm_deps needs it bare).

Every test using a fixture in `ONE_WORKER` gets that fixture's group, and `--dist loadgroup` sends
each group to one worker, in collection order (as a serial run orders them); the Slurm cluster
starts once. xdist's own `xdist_group` marker cannot carry this here: xdist 3.8 tags a grouped test
by rewriting `item._nodeid`, which pytest 9.2 no longer reads (its nodeid comes from `item._id`), so
its loadgroup spreads a group over every worker. Instead each worker writes the groups it collected
(nodeid -> group) to a file the controller named (`GROUPS_ENV`), and the controller's scheduler
(`GroupScheduling`, from `pytest_xdist_make_scheduler`) reads them; the marker is set as well. What the
suite leaves in root's home is removed once, by the controller after every worker finished
(`snapshot_home` / `restore_home`): a worker that cleaned up at its own end would delete what another
worker's running test just made (a loginNode's experiment dirs). So would a pytest that a test starts
(`owns_home`: only the outermost run cleans up). Each worker's SSH user home goes with
that worker's session (`ssh_user`)."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional, Set

import pytest

# fixture -> the xdist_group of every test using it (run on one worker, in one session): what runs as
# root on the worker side, in root's home. Slurm's nodes and login node run as root on this machine (and
# one cluster is enough); `root_login` is for SSH tests that need root there (mounts). The other SSH
# tests log in as their session's own user (tests/support/remote/fixtures.py: ssh_user) and run anywhere.
ONE_WORKER = {"slurm": "root-home", "login_node": "root-home", "root_login": "root-home"}

HomeSnapshot = Dict[Path, Optional[Set[Path]]]


def is_worker(config: pytest.Config) -> bool:
    """This process is an xdist worker (not the controller, nor a plain `-n 0` run)."""
    return hasattr(config, "workerinput")


HOME_OWNER_ENV = "NNI_TEST_HOME_OWNER"  # set by the outermost pytest: its pid; every process below inherits it


def owns_home(config: pytest.Config) -> bool:
    """This pytest cleans root's home at its end: the outermost run only (the controller, or a plain
    run), never a worker, nor a pytest that a test starts (the marker audit, the fresh clone's
    collection, the crash check). Such a nested run would remove what the suite's other workers made
    meanwhile: a live Slurm experiment's directory on the login node, seen gone mid-test once the
    nested runs were scheduled beside the Slurm tests. Marks this process the owner."""
    if is_worker(config) or os.environ.get(HOME_OWNER_ENV):
        return False
    os.environ[HOME_OWNER_ENV] = str(os.getpid())
    return True


GROUPS_ENV = "NNI_TEST_XDIST_GROUPS"  # the file where workers put nodeid -> group for the controller


def group_of(item: pytest.Item) -> str | None:
    """The group of a fixture the test uses, else the one its parameter names (`pytest.param(...,
    marks=xdist_group(g))`: a parametrized fixture that picks a grouped one at run time)."""
    names = getattr(item, "fixturenames", ())
    group = next((g for fixture, g in ONE_WORKER.items() if fixture in names), None)
    mark = item.get_closest_marker("xdist_group")
    return group if group is not None or mark is None or not mark.args else str(mark.args[0])


def group_items(items: list[pytest.Item]) -> None:
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def start_groups(config: pytest.Config) -> None:
    """Controller, before the workers start: name the file they write their groups to (they inherit
    the environment)."""
    if config.getoption("dist", "no") == "loadgroup" and not is_worker(config):
        fd, path = tempfile.mkstemp(prefix="nni-xdist-groups-", suffix=".json")
        os.close(fd)
        os.environ[GROUPS_ENV] = path


def end_groups(config: pytest.Config) -> None:
    path = os.environ.pop(GROUPS_ENV, None) if not is_worker(config) else None
    if path:
        Path(path).unlink(missing_ok=True)


def slow_first(items: list[pytest.Item]) -> None:
    """The tests marked `slow` (20 s or more each, as measured here) go first, in their own order. The
    workers ask for tests in collection order, so a long test collected last (the top-level tests/test_*.py
    come last) ran alone at the end while the other workers had finished: the longest first leaves
    short tests to even out the end. Every worker sorts alike, so their collections still agree."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def write_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Worker, after collection (before it reports its collection): every worker collects the same
    tests, so each writes the same map; written whole and renamed, never seen half-written."""
    path = os.environ.get(GROUPS_ENV)
    if not path or not is_worker(config):
        return
    groups = {item.nodeid: g for item in items if (g := group_of(item)) is not None}
    tmp = f"{path}.{os.getpid()}"
    Path(tmp).write_text(json.dumps(groups))
    os.replace(tmp, path)


def make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadgroup` with the groups the workers wrote (None: xdist's own choice)."""
    if config.getoption("dist", "no") != "loadgroup" or not os.environ.get(GROUPS_ENV):
        return None
    from xdist.scheduler import LoadGroupScheduling

    path = os.environ[GROUPS_ENV]

    class GroupScheduling(LoadGroupScheduling):
        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:  # first asked once every worker reported its collection
                self._groups = json.loads(Path(path).read_text() or "{}")
            group = self._groups.get(nodeid)
            return f"group:{group}" if group else super()._split_scope(nodeid)

        def remove_node(self, node: Any) -> str | None:
            """A crashed worker's work goes back to the queue without the units it finished and
            without the test it crashed in (reported failed, as `--dist load` does): xdist 3.8
            queues them all, and a finished unit sent to a worker runs nothing, so no worker ever
            asks for the rest and the run hangs (seen after a segfault at 91%)."""
            crashed = super().remove_node(node)
            if crashed is not None:
                for scope, unit in list(self.workqueue.items()):
                    unit.pop(crashed, None)
                    if all(unit.values()):  # nothing left to run in it (or empty)
                        del self.workqueue[scope]
            return crashed

    return GroupScheduling(config, log)  # type: ignore[arg-type]


def _home_dirs() -> list[Path]:
    home = Path.home()
    return [home / "nni-experiments", home / ".nni-agent" / "run", home / ".nni-agent"]


def snapshot_home() -> HomeSnapshot:
    return {d: set(d.iterdir()) if d.is_dir() else None for d in _home_dirs()}


def restore_home(before: HomeSnapshot) -> None:
    """Remove what the suite made under the home's agent and experiment dirs, keeping what was there."""
    for d, old in before.items():
        if old is None:
            shutil.rmtree(d, ignore_errors=True)
        elif d.is_dir():
            for entry in set(d.iterdir()) - old:
                shutil.rmtree(entry, ignore_errors=True)
