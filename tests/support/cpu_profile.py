"""Where the suite's time goes, per test: wall seconds and CPU seconds (the test process's own and
its waited-for children's), one JSON line per test appended to $NNI_TEST_PROFILE.

The suite is CPU-bound on a small machine (more workers than cores only help while tests wait), so
its wall time is set by the CPU its tests burn: this is the figure to cut. Enable it with
`-p tests.support.cpu_profile` (scripts/test.sh passes extra arguments through); summarise with
`python scripts/test_profile.py FILE`. CPU of processes nobody waits for (daemons, sshd's sessions,
Slurm's jobs) is not counted, so the figures are a lower bound."""
from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator

import pytest


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    path = os.environ.get("NNI_TEST_PROFILE")
    wall, own, kids = time.monotonic(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    yield
    if not path:
        return
    row = {"test": item.nodeid, "wall": round(time.monotonic() - wall, 3),
           "cpu_self": round(_cpu(resource.RUSAGE_SELF) - own, 3),
           "cpu_children": round(_cpu(resource.RUSAGE_CHILDREN) - kids, 3),
           "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
    with open(path, "a") as f:  # one short write per line: workers append without tearing
        f.write(json.dumps(row) + "\n")
