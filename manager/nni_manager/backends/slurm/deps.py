"""The agent's dependencies shipped to the compute nodes' Python through the shared file system.

A cluster's Python (`pythonPath`: a module's, a bare venv's) often lacks grpcio, protobuf or
psutil, and compute nodes seldom reach a package index. At start the manager runs the boot
step's `--check` once with that Python where the Slurm commands run (this host, or the login
node over SSH): it reports the Python's version, machine and C library and what is missing or of
an unsupported version. This takes the login node's Python at `pythonPath` to be the compute
nodes' (the same path on the shared file system, as modules and venvs are on most clusters; no
`srun`, which could wait in the queue). Where the two differ, the boot step on the compute node
still checks for itself and fails the trial with its one line.

When something is missing, the manager resolves wheels for that Python (agent_deps: its cache,
`agentWheelhouse`, or one `pip download` here) and puts them, one piece each, into
`<experiments dir>/agent-deps/deps-<python key>-<wheels hash>/wheels/` (locally, or by SFTP to
the login node), renamed into place only when complete; the jobs' boot step (`--parts`,
`--deps-to`) unpacks them once into `.../lib` beside it and puts that on the agent's path. The
directory outlives the experiment, so the next experiment with that Python ships nothing.
Delete `agent-deps/` to start afresh.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nni_manager import notices
from nni_manager.backends import agent_deps
from nni_manager.backends.agent_command import boot_source
from nni_manager.backends.slurm.hosts import SlurmHost

log = logging.getLogger(__name__)

DEPS_DIR = "agent-deps"  # under the experiments directory (shared by the experiments of this user)
WHERE = "the compute node"


@dataclass(frozen=True)
class Shipped:
    """Dependency wheels on the shared file system, and where the boot step unpacks them."""

    wheels: str  # directory of `<wheel>.000` pieces (boot.py --parts)
    lib: str  # unpacked here once (boot.py --deps-to)


async def probe(host: SlurmHost, python: str) -> dict[str, Any] | None:
    """The boot step's `--check` report for `python` where the Slurm commands run; None when that
    Python does not run there (the compute node's boot step then says why)."""
    rc, out, err = await host.run([python, "-", "--check", "--where", WHERE], stdin=boot_source())
    lines = out.strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else None
    except ValueError:
        report = None
    if not isinstance(report, dict) or "version" not in report:
        log.warning("cannot check %s %s (exit %s: %s): nothing shipped; the compute nodes' boot step will say "
                    "what is missing", python, host.where, rc, (err.strip().splitlines() or ["no output"])[-1][:300])
        return None
    return report


def wheels_dir_name(worker: agent_deps.WorkerPython, wheels: agent_deps.Wheels) -> str:
    """`deps-<key>-<hash of the wheels' names>`: another set of wheels gets another directory."""
    digest = hashlib.sha256("\n".join(f.name for f in wheels.files).encode()).hexdigest()[:10]
    return f"deps-{worker.key}-{digest}"


async def ship(host: SlurmHost, python: str, root: str, wheelhouse: Path | None) -> Shipped | None:
    """Ship what `python` lacks into `root`/agent-deps (once for every experiment); None when it
    lacks nothing, or nothing can be shipped (the job's boot step then fails with its one line)."""
    report = await probe(host, python)
    if report is None or not report.get("fixes"):
        return None
    worker = agent_deps.WorkerPython.from_report(report)
    try:
        wheels = await asyncio.to_thread(agent_deps.resolve, worker, wheelhouse)
    except agent_deps.DependencyError as e:
        notices.deps_unshipped(f"{python} {host.where}", f"{'; '.join(report.get('problems') or [])}. {e}")
        return None
    base = f"{root}/{DEPS_DIR}/{wheels_dir_name(worker, wheels)}"
    shipped = Shipped(wheels=f"{base}/wheels", lib=f"{base}/lib")
    rc, _, _ = await host.run(["test", "-d", shipped.wheels])
    if rc == 0:
        log.info("the agent's dependencies for %s are already at %s", worker.key, shipped.wheels)
        return shipped
    await host.make_private_dir(base)
    tmp = f"{base}/.wheels-{secrets.token_hex(4)}"
    await host.make_private_dir(tmp)
    try:
        for f in wheels.files:
            await host.put_file(str(f), f"{tmp}/{agent_deps.piece_name(f)}")  # one piece each: boot.py joins pieces
        rc, _, err = await host.run(["mv", "-T", tmp, shipped.wheels])  # complete, or not there at all
    finally:
        await host.run(["rm", "-rf", "--", tmp])
    if rc != 0:
        rc2, _, _ = await host.run(["test", "-d", shipped.wheels])
        if rc2 != 0:  # not another manager's win: a real failure
            raise agent_deps.DependencyError(f"cannot put the agent's dependencies into {shipped.wheels} "
                                             f"{host.where}: {err.strip()[-300:] or f'mv exited {rc}'}")
    else:
        log.info("shipped %d wheels (%d bytes) of the agent's dependencies to %s for %s", len(wheels.files),
                 wheels.size, shipped.wheels, worker.key)
    return shipped

