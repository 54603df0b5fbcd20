"""What the suite needs to run on several pytest-xdist workers at once (scripts/test.sh runs
`-n N --dist loadgroup`; docs/testing.md).

Each worker is its own pytest process with its own session fixtures, so every session resource
is made per worker with a unique name (network namespaces, sshd ports and dirs, emulators, temp
dirs). Two kinds of thing cannot be made per worker, and are handled here:

* Whatever a test checks machine-wide: the Slurm tests count the loginNode relays running on the
  machine (`relay_processes`), and one real cluster (munged, slurmctld, two slurmd) is enough.
* The SSH user's home: the remote, hybrid and SSH security tests' agents live under root's real
  home (sshd sessions take it from passwd, not from $HOME), and those tests set up what they need
  there: an agent install removed to prove a fresh one (test_bootstrap), dependencies shipped to
  `~/.nni-agent/<tag>/deps-<py>` that make a bare worker usable (test_shipped_deps, test_deps_notice)
  where another test needs it unusable (test_no_worker). Run side by side they break each other.

Every test using a fixture in `ONE_WORKER` gets that fixture's `xdist_group`, so `--dist loadgroup`
sends each group to one worker, in collection order (as a serial run orders them); the Slurm
cluster starts once. What the suite leaves in the SSH user's home is removed once, by the controller
after every worker finished (`snapshot_home` / `restore_home`): a worker that cleaned up at its own
end would delete what another worker's running test just made (a loginNode's experiment dirs).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Dict, Optional, Set

import pytest

# fixture -> the xdist_group of every test using it (run on one worker, in one session)
ONE_WORKER = {"slurm": "slurm", "login_node": "slurm",
              "ssh_keys": "ssh-home", "plain_sshd": "ssh-home", "netns_hosts": "ssh-home", "password_user": "ssh-home"}

HomeSnapshot = Dict[Path, Optional[Set[Path]]]


def is_worker(config: pytest.Config) -> bool:
    """This process is an xdist worker (not the controller, nor a plain `-n 0` run)."""
    return hasattr(config, "workerinput")


def group_items(items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        group = next((g for fixture, g in ONE_WORKER.items() if fixture in names), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


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
