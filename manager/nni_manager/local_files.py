"""Reading a trial's log files on the manager's host without trusting any path an agent sent.

A trial's `working_directory` is whatever its agent reported: a remote or compromised agent can
name `/etc`, and the WebUI once served the manager's `/etc/passwd` that way. So files are read
only from the manager's own streamed copies (`<experiment>/trials/<id>/`) and, for a trial of
the local agent on the local (or hybrid) platform, from its directory inside that agent's work
directory (`<experiment>/agents/local/`): the directory must resolve inside that root, and the
file is opened with O_NOFOLLOW, so neither a reported path nor a symlink leads out. What is
served is capped (`SERVE_LIMIT`, the file's tail beyond), since log chunks come from agents too.
"""
from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import BinaryIO

from nni_manager.backends.local import AGENT_NAME
from nni_manager.types import TrialJobDetail

log = logging.getLogger(__name__)

SERVE_LIMIT = 16 << 20  # of one log, what the WebUI serves at once (its tail beyond)
_LOCAL_PLATFORMS = ("local", "hybrid")
_warned: set[str] = set()  # trials whose reported directory was refused (warned once each)


def local_work_dir(experiment_dir: Path) -> Path:
    """Where the local backend runs its agent (and so its trials' directories)."""
    return experiment_dir / "agents" / AGENT_NAME


def _inside(root: Path, directory: Path) -> str | None:
    """`directory` resolved, when that lies inside `root` resolved (symlinks followed); else None."""
    try:
        real_root, real = os.path.realpath(root), os.path.realpath(directory)
        return real if os.path.commonpath([real_root, real]) == real_root else None
    except (OSError, ValueError):
        return None


def open_in(root: Path, directory: Path, name: str) -> BinaryIO | None:
    """`name` in `directory` for reading, or None: when `directory` does not resolve inside
    `root`, when `name` is no plain file name, a symlink or no regular file, or it is missing."""
    if not name or "/" in name or "\x00" in name or name in (".", ".."):
        return None
    real = _inside(root, directory)
    if real is None:
        return None
    try:
        dir_fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:  # O_NONBLOCK: a FIFO planted under the name never blocks the reader
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def from_local_agent(platform: str, t: TrialJobDetail) -> bool:
    """Whether the trial ran on this machine's local agent, whose directory the manager may read."""
    return platform in _LOCAL_PLATFORMS and list(t.agents) == [AGENT_NAME]


def _places(experiment_dir: Path, t: TrialJobDetail, platform: str) -> list[tuple[Path, Path]]:
    """(directory, root it must stay in) to look in for the trial's files, in order."""
    places = [(experiment_dir / "trials" / t.id, experiment_dir)]
    if not t.working_directory or not from_local_agent(platform, t):
        return places
    root = local_work_dir(experiment_dir)
    if _inside(root, Path(t.working_directory)) is not None:
        places.append((Path(t.working_directory), root))
    elif t.id not in _warned and len(_warned) < 1024:
        _warned.add(t.id)
        log.warning("trial %s: its reported directory %r is outside the local agent's work directory %s: "
                    "its files there are not read", t.id, t.working_directory[:200], root)
    return places


def open_trial_log(experiment_dir: Path, t: TrialJobDetail, name: str, platform: str) -> BinaryIO | None:
    """The manager's streamed copy of the trial's `name`; else, for a trial of the local
    agent, the file in its own directory (confined as above); None when neither exists."""
    for directory, root in _places(experiment_dir, t, platform):
        f = open_in(root, directory, name)
        if f is not None:
            return f
    return None


def trial_log_path(experiment_dir: Path, t: TrialJobDetail, name: str, platform: str) -> Path | None:
    """Where `open_trial_log` finds the file (symlinks resolved), for exports that link to it."""
    for directory, root in _places(experiment_dir, t, platform):
        f = open_in(root, directory, name)
        if f is not None:
            f.close()
            return Path(os.path.realpath(directory)) / name
    return None


def read_capped(f: BinaryIO, limit: int = SERVE_LIMIT, tail: bool = True) -> bytes | None:
    """The whole file (closed after) up to `limit` bytes; past that, with `tail`, a note and its
    last `limit` bytes (a log), else None (too large to serve)."""
    with f:
        size = os.fstat(f.fileno()).st_size
        if size <= limit:
            return f.read(limit)
        if not tail:
            return None
        f.seek(size - limit)
        return f"[first {size - limit} bytes not shown: the file has {size}]\n".encode() + f.read(limit)
