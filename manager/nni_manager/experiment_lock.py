"""One manager per experiment: an `flock` on `<experiment dir>/manager.lock`, held for the
manager's life, which the OS releases when the process dies (a crash or SIGKILL leaves no stale
lock). A second `run`/`resume`/`view` of the same experiment is refused before it touches the
store or the manifest, naming the running manager's pid and WebUI, as `nnictl` refuses.
NNI's own manager serving the same experiment (`nnictl resume ID` / `nnictl view ID` start it on
the NNI database we write at stop) holds no flock: it is found by its command line and refused
likewise, or the two would share the experiment's directory and its manifest entry.

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
    try:
        _refuse_nni_manager(experiment_dir, experiment_id)
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
    """Raise ExperimentBusy if another process holds the lock or NNI's own manager serves the
    experiment; take nothing, create nothing."""
    path = _lock_path(experiment_dir)
    if path in _held:
        return
    _refuse_nni_manager(experiment_dir, experiment_id)
    if not path.is_file():
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
        url = str(urls[0]) if isinstance(urls, (list, str)) and urls else ""
    who = f"nni-manager pid {pid}" if pid else "another nni-manager"
    where = f", WebUI {url}" if url else " (no WebUI)"
    return (f"experiment {experiment_id} is already running ({who}{where}): stop it first with "
            f"`nni-manager stop {experiment_id}`, or open its WebUI")


def nni_manager_serving(experiment_dir: Path, experiment_id: str) -> tuple[int, str] | None:
    """(pid, action) of a live NNI 3.0 manager (`node .../nni_node/main.js --experiment-id ID
    --action resume|view|create --experiments-directory DIR`) on this experiment, or None."""
    want = Path(experiment_dir).expanduser().resolve()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            raw = (proc / "cmdline").read_bytes()
            if b"main.js" not in raw or experiment_id.encode() not in raw:
                continue
            args = raw.decode(errors="replace").split("\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == "Z" or not any(a.endswith("main.js") for a in args) or "--experiment-id" not in args:
            continue
        given = dict(zip(args, args[1:]))
        if given.get("--experiment-id") != experiment_id or "--experiments-directory" not in given:
            continue
        if (Path(given["--experiments-directory"]).expanduser() / experiment_id).resolve() == want:
            return int(proc.name), given.get("--action", "")
    return None


def _refuse_nni_manager(experiment_dir: Path, experiment_id: str) -> None:
    found = nni_manager_serving(experiment_dir, experiment_id)
    if found is None:
        return
    pid, action = found
    how = f"`nnictl {action} {experiment_id}`" if action in ("resume", "view") else "nnictl"
    kept = (" (the trials it runs stay in NNI's database, which nni-manager does not read)"
            if action != "view" else "")
    raise ExperimentBusy(
        f"experiment {experiment_id} is served by NNI's own manager (node pid {pid}, started by {how}){kept}: "
        f"stop it first with `nnictl stop {experiment_id}`; then `nni-manager resume {experiment_id}` runs it here")


def _lock_path(experiment_dir: Path) -> Path:
    return (Path(experiment_dir).expanduser() / LOCK_NAME).absolute()
