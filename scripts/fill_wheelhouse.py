#!/usr/bin/env python3
"""Fill an `agentWheelhouse` directory: the agent's dependencies as wheels for workers'
Pythons, for sites whose workers (and manager) cannot reach a package index.

Run it where there is internet, copy the directory to the manager, name it in the config:
    python scripts/fill_wheelhouse.py WHEELHOUSE --python 3.8 3.10 3.11 --machine x86_64 aarch64
The same resolver the manager uses checks the result, so what is printed as complete ships.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nni_manager.backends import agent_deps
from nni_manager.backends.agent_wheel import agent_requirements


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dest", type=Path)
    ap.add_argument("--python", nargs="+", default=["%d.%d" % sys.version_info[:2]], help="workers' Python versions")
    ap.add_argument("--machine", nargs="+", default=["x86_64"], help="workers' architectures")
    ap.add_argument("--glibc", default="2.17", help="the oldest glibc among the workers (manylinux2014: 2.17)")
    args = ap.parse_args()
    args.dest.mkdir(parents=True, exist_ok=True)
    glibc = tuple(int(x) for x in args.glibc.split("."))
    bad = 0
    for version in args.python:
        for machine in args.machine:
            worker = agent_deps.WorkerPython(tuple(int(x) for x in version.split(".")), machine, glibc)  # type: ignore[arg-type]
            agent_deps.download(worker, agent_requirements(), args.dest)
            try:
                wheels = agent_deps.resolve(worker, args.dest, allow_download=False, cache=args.dest)
            except agent_deps.DependencyError as e:
                print(f"{worker.key}: incomplete: {e}", file=sys.stderr)
                bad += 1
                continue
            print(f"{worker.key}: {len(wheels.files)} wheels, {wheels.size / 1e6:.1f} MB")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
