"""Where the Slurm commands run and the job files live: this host (`LocalHost`) or a login node
over SSH (`login.LoginNodeHost`). The backend speaks only this interface, so the job logic is the
same either way; paths are strings in the host's own file system."""
from __future__ import annotations

import asyncio
import os
import shlex
import shutil
from pathlib import Path
from typing import Protocol, Sequence

from nni_agent.compat import wait_for

COMMAND_TIMEOUT = 60.0
LOG_TAIL = 4000  # bytes of a job's log read for an error message


class SlurmHost(Protocol):
    where: str  # "on this host", "on login node alice@login:22": for messages and the dry run

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    def base_dir(self) -> str: ...  # the experiment's directory there (job dirs under <base>/slurm)
    async def missing_commands(self, names: Sequence[str]) -> list[str]: ...
    async def run(self, argv: Sequence[str], stdin: str | None = None, cwd: str | None = None) -> tuple[int, str, str]: ...
    async def make_private_dir(self, path: str) -> None: ...
    async def write_private(self, path: str, data: bytes) -> None: ...
    async def write_text(self, path: str, text: str) -> None: ...
    async def put_file(self, local: str, path: str) -> None: ...  # a copy of a file of this host (0600)
    async def remove(self, paths: Sequence[str]) -> None: ...
    async def log_tail(self, job_dir: str) -> str: ...  # the first non-empty agent-*.log, else job.out


def command_line(argv: Sequence[str], cwd: str | None = None) -> str:
    """The shell line that runs argv in cwd (for a login node, and for the dry run)."""
    line = " ".join(shlex.quote(a) for a in argv)
    return f"cd {shlex.quote(cwd)} && {line}" if cwd else line


def write_secret(path: Path, data: bytes) -> None:
    """A 0600 file whose bytes never sit in a file anyone else may read."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


class LocalHost:
    """The manager's own host: the Slurm client commands are on PATH and the experiment directory
    is on a file system the compute nodes see."""

    where = "on this host"

    def __init__(self, experiment_dir: Path) -> None:
        self.experiment_dir = experiment_dir

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def base_dir(self) -> str:
        return str(self.experiment_dir)

    async def missing_commands(self, names: Sequence[str]) -> list[str]:
        return [n for n in names if shutil.which(n) is None]

    async def run(self, argv: Sequence[str], stdin: str | None = None, cwd: str | None = None) -> tuple[int, str, str]:
        """(exit status, stdout, stderr). A missing command or a hang is an rc 127/124."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=cwd)
        except FileNotFoundError:
            return 127, "", f"{argv[0]}: command not found (are the Slurm client commands on PATH?)"
        try:
            out, err = await wait_for(proc.communicate(stdin.encode() if stdin is not None else None),
                                      COMMAND_TIMEOUT)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            return 124, "", f"{argv[0]} did not answer within {COMMAND_TIMEOUT:g} s (is slurmctld up?)"
        return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")

    async def make_private_dir(self, path: str) -> None:
        Path(path).mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)

    async def write_private(self, path: str, data: bytes) -> None:
        write_secret(Path(path), data)

    async def write_text(self, path: str, text: str) -> None:
        Path(path).write_text(text)

    async def put_file(self, local: str, path: str) -> None:
        tmp = f"{path}.part"
        await asyncio.to_thread(shutil.copyfile, local, tmp)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)

    async def remove(self, paths: Sequence[str]) -> None:
        for p in paths:
            try:
                os.unlink(p)
            except OSError:
                pass

    async def log_tail(self, job_dir: str) -> str:
        d = Path(job_dir)
        for p in sorted(d.glob("agent-*.log")) + [d / "job.out"]:
            try:
                text = p.read_text(errors="replace")[-LOG_TAIL:]
            except OSError:
                continue
            if text.strip():
                return text
        return ""
