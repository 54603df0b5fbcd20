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
`<experiments dir>/agent-deps/deps-<python key>-<hash of the wheels' contents>/wheels/` (locally,
or by SFTP to the login node), renamed into place only when complete; the jobs' boot step
(`--parts`, `--deps-to`) unpacks them once into `.../lib` beside it and puts that on the agent's
path. The directory outlives the experiment, so the next experiment with that Python ships
nothing.

Nothing there is trusted by its name: `agent-deps/` and each `deps-*` directory are this user's
and 0700 (a directory someone else made is never used: the manager ships into a fresh name), an
existing `wheels/` is reused only when every piece's sha256 is what the manager would ship (else
it is shipped afresh), and the batch script carries every wheel's sha256, which the boot step
checks before it unpacks anything. Delete `agent-deps/` to start afresh.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
from functools import partial
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    sha256: tuple[tuple[str, str], ...] = ()  # (wheel file name, sha256): the batch script's --sha256


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


def wheels_dir_name(worker: agent_deps.WorkerPython, digests: tuple[tuple[str, str], ...]) -> str:
    """`deps-<key>-<hash of the wheels' contents>`: other wheels get another directory."""
    digest = hashlib.sha256("".join(f"{n}={d}\n" for n, d in sorted(digests)).encode()).hexdigest()[:16]
    return f"deps-{worker.key}-{digest}"


# run by the probed Python where the Slurm commands run: who owns each path, its mode, and the
# sha256 of every file in the last one (stdlib only, any Python 3)
_INSPECT = """import hashlib, json, os, sys
out = {"uid": os.getuid(), "dirs": {}, "files": {}}
for d in sys.argv[1:]:
    try:
        st = os.lstat(d)
        out["dirs"][d] = [st.st_uid, st.st_mode & 0o7777, os.path.isdir(d) and not os.path.islink(d)]
    except OSError:
        out["dirs"][d] = None
last = sys.argv[-1]
if out["dirs"][last] and out["dirs"][last][2]:
    for n in sorted(os.listdir(last)):
        h = hashlib.sha256()
        with open(os.path.join(last, n), "rb") as f:
            for b in iter(lambda: f.read(1 << 20), b""):
                h.update(b)
        out["files"][n] = h.hexdigest()
print(json.dumps(out))
"""


async def inspect(host: SlurmHost, python: str, paths: list[str]) -> dict[str, Any] | None:
    """Owner, mode and kind of each of `paths`, and the digests of the files in the last one."""
    rc, out, _ = await host.run([python, "-", *paths], stdin=_INSPECT)
    try:
        got = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return got if isinstance(got, dict) else None


def _mine(seen: dict[str, Any], path: str) -> bool:
    """`path` is absent, or this user's private directory."""
    st = seen["dirs"].get(path)
    return st is None or (st[0] == seen["uid"] and st[1] & 0o077 == 0 and st[2])


async def ship(host: SlurmHost, python: str, root: str, wheelhouse: Path | None) -> Shipped | None:
    """Ship what `python` lacks into `root`/agent-deps (once for every experiment); None when it
    lacks nothing, or nothing can be shipped (the job's boot step then fails with its one line)."""
    report = await probe(host, python)
    if report is None or not report.get("fixes"):
        return None
    worker = agent_deps.WorkerPython.from_report(report)
    try:
        wheels = await asyncio.to_thread(partial(
            agent_deps.resolve, worker, wheelhouse,
            where=f"{python} {host.where} ({'; '.join(report.get('problems') or [])})"))
    except agent_deps.DependencyError:  # said on the console; the job's boot step fails with its one line
        return None
    digests = await asyncio.to_thread(agent_deps.digests, wheels.files)
    top = f"{root}/{DEPS_DIR}"
    base = f"{top}/{wheels_dir_name(worker, digests)}"
    seen = await inspect(host, python, [top, base, f"{base}/wheels"])
    if seen is None:
        raise agent_deps.DependencyError(f"cannot inspect {base} {host.where} with {python}")
    if not _mine(seen, top):
        raise agent_deps.DependencyError(
            f"{top} {host.where} is not your private directory (another user's, or writable by others): the "
            f"agent's dependencies are not shipped through it. Fix: remove it, or set experimentWorkingDirectory "
            f"to a directory only you can write")
    if not _mine(seen, base):  # someone else's, under the same name: never used; ours goes beside it
        log.warning("%s %s is not yours (or writable by others): not used; shipping into a fresh directory",
                    base, host.where)
        base = f"{base}-{secrets.token_hex(4)}"
        seen = {"uid": seen["uid"], "dirs": {}, "files": {}}
    shipped = Shipped(wheels=f"{base}/wheels", lib=f"{base}/lib", sha256=digests)
    want = {agent_deps.piece_name(Path(n)): d for n, d in digests}
    if seen["dirs"].get(f"{base}/wheels") and seen["files"] == want:  # compared by content, never by name
        log.info("the agent's dependencies for %s are already at %s", worker.key, shipped.wheels)
        return shipped
    if seen["dirs"].get(f"{base}/wheels"):
        log.warning("%s %s does not hold the wheels the manager ships (changed or incomplete): shipping afresh",
                    shipped.wheels, host.where)
        await host.run(["rm", "-rf", "--", shipped.wheels])
    await host.make_private_dir(top)
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

