"""One manager per experiment: an `flock` on `<experiment dir>/manager.lock`, held for the
manager's life, which the OS releases when the process dies (a crash or SIGKILL leaves no stale
lock). A second `run`/`resume`/`view` of the same experiment is refused before it touches the
store or the manifest, naming the running manager's pid and WebUI, as `nnictl` refuses.

Taking it is re-entrant within one process (the CLI takes it before the WebUI registers, the
training service takes it again when it opens the store): flock locks belong to an open file,
so a second open of the same file in one process would otherwise lock itself out.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from nni_manager.errors import TrainingServiceError

LOCK_NAME = "manager.lock"

_held: dict[Path, tuple[int, int]] = {}  # resolved lock path -> (fd, how many takers in this process)


class ExperimentBusy(TrainingServiceError):
    """Another live manager runs (or serves) this experiment; the message names it and what to do."""


def acquire(experiment_dir: Path, experiment_id: str) -> None:
    """Take the experiment's lock (creating its directory, private to its owner), or raise
    ExperimentBusy naming the process that holds it."""
    path = _lock_path(experiment_dir)
    if path in _held:
        fd, count = _held[path]
        _held[path] = (fd, count + 1)
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ExperimentBusy(busy_message(experiment_id, holder_pid(experiment_dir))) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[path] = (fd, 1)


def release(experiment_dir: Path) -> None:
    """Give back one take of the lock; the last one unlocks it (process exit does too)."""
    path = _lock_path(experiment_dir)
    if path not in _held:
        return
    fd, count = _held.pop(path)
    if count > 1:
        _held[path] = (fd, count - 1)
        return
    os.close(fd)  # closing the only descriptor releases the flock


def check_free(experiment_dir: Path, experiment_id: str) -> None:
    """Raise ExperimentBusy if another process holds the lock; take nothing, create nothing."""
    path = _lock_path(experiment_dir)
    if path in _held or not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ExperimentBusy(busy_message(experiment_id, holder_pid(experiment_dir))) from None
    finally:
        os.close(fd)


def holder_pid(experiment_dir: Path) -> int | None:
    """The pid the holder wrote into the lock file (read without locking)."""
    try:
        text = _lock_path(experiment_dir).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def busy_message(experiment_id: str, pid: int | None) -> str:
    """One line: who runs it, where its WebUI is, what to do."""
    from nni_manager.webui import manifest

    url = ""
    try:
        entry = manifest.read().get(experiment_id)
    except (OSError, ValueError):
        entry = None
    if isinstance(entry, dict) and (pid is None or entry.get("pid") == pid) and entry.get("status") != "STOPPED":
        urls = entry.get("webuiUrl") or []
        url = str(urls[0]) if urls else ""
    who = f"nni-manager pid {pid}" if pid else "another nni-manager"
    where = f", WebUI {url}" if url else " (no WebUI)"
    return (f"experiment {experiment_id} is already running ({who}{where}): stop it first with "
            f"`nni-manager stop {experiment_id}`, or open its WebUI")


def _lock_path(experiment_dir: Path) -> Path:
    return (Path(experiment_dir).expanduser() / LOCK_NAME).absolute()
