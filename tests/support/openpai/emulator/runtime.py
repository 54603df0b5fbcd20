"""A task's "container": its command as a real bash process in its own session, the way the
openpai-runtime runs ``user.sh``; and killing whole process trees (the pod going away).

Every task process carries ``PAI_EMULATOR_INSTANCE`` / ``PAI_EMULATOR_TASK`` in its environment, so
descendants that left the process group (setsid, daemons) are still found and killed."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

INSTANCE_ENV = "PAI_EMULATOR_INSTANCE"
TASK_ENV = "PAI_EMULATOR_TASK"

# openpai-runtime src/runtime.d/user.sh: the rendered user command is appended to this header
USER_SH_HEADER = "#!/bin/bash\n\nset -o errexit\nset -o nounset\nset -o pipefail\n\n# user's commands here\n"


def free_ports(count: int, taken: set[int]) -> list[int]:
    """Free loopback ports (tasks share the host network, as PAI pods run with hostNetwork)."""
    out: list[int] = []
    while len(out) < count:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p not in taken:
            taken.add(p)
            out.append(p)
    return out


def marked_pids(instance: str, task_key: str | None = None) -> list[int]:
    """Live processes whose environment names this emulator instance (and task, if given)."""
    want = f"{INSTANCE_ENV}={instance}".encode()
    want_task = f"{TASK_ENV}={task_key}".encode() if task_key else None
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{d}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
        except OSError:
            continue
        if want in env and (want_task is None or want_task in env):
            out.append(int(d))
    return out


def write_script(path: Path, command: str) -> None:
    """user.sh, 0700: the command (secrets already rendered) lives in a file, never in argv."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
    with os.fdopen(fd, "w") as f:
        f.write(USER_SH_HEADER + command)


# A container's storages: in the task's own mount namespace, each backing directory bound where
# the job protocol says. A missing mount point is made on a fresh tmpfs over its nearest existing
# ancestor (a container's own filesystem), never on the host's.
MOUNT_SH = r"""set -eu
script=$1; shift
fresh=" "
while [ $# -gt 0 ]; do
  src=$1; dst=$2; shift 2
  if [ ! -d "$dst" ]; then
    a=$(dirname "$dst")
    while [ ! -d "$a" ]; do a=$(dirname "$a"); done
    [ "$a" != / ] || { echo "storage: cannot make mount point $dst" >&2; exit 1; }
    case "$fresh" in *" $a "*) ;; *) mount -t tmpfs pai-storage "$a"; fresh="$fresh$a ";; esac
    mkdir -p "$dst"
  fi
  mount --bind "$src" "$dst"
done
exec /bin/bash "$script"
"""


def _argv(script: Path, mounts: list[tuple[str, str]]) -> list[str]:
    if not mounts:
        return ["/bin/bash", str(script)]
    userns = [] if os.geteuid() == 0 else ["--map-root-user"]
    return ["unshare", "--mount", "--propagation", "private", *userns, "/bin/bash", "-c", MOUNT_SH, "pai-storage",
            str(script), *[p for pair in mounts for p in pair]]


async def spawn(script: Path, cwd: Path, env: dict[str, str], log_dir: Path,
                mounts: list[tuple[str, str]] | None = None) -> asyncio.subprocess.Process:
    log_dir.mkdir(parents=True, exist_ok=True)
    # a container's /tmp is its own and goes with it: the task's TMPDIR is a directory of its own
    tmp = log_dir.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    os.chmod(tmp, 0o1777)
    env = {"TMPDIR": str(tmp), **env}
    with open(log_dir / "user.pai.stdout", "ab") as out, open(log_dir / "user.pai.stderr", "ab") as err:
        return await asyncio.create_subprocess_exec(
            *_argv(script, mounts or []), cwd=str(cwd), env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=out, stderr=err, start_new_session=True)


def _signal_all(pgid: int | None, pids: list[int], sig: int) -> None:
    if pgid:
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass


async def kill_tree(pgid: int | None, instance: str, task_key: str, grace: float, sig: int = signal.SIGTERM) -> None:
    """SIGTERM (or ``sig``) the group and every marked process, SIGKILL what is left after ``grace``."""
    _signal_all(pgid, marked_pids(instance, task_key), sig)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while loop.time() < deadline:
        if not marked_pids(instance, task_key):
            return
        await asyncio.sleep(0.05)
    await kill_now(pgid, instance, task_key)


async def kill_now(pgid: int | None, instance: str, task_key: str) -> None:
    for _ in range(50):
        left = marked_pids(instance, task_key)
        _signal_all(pgid, left, signal.SIGKILL)
        if not left:
            return
        await asyncio.sleep(0.02)
