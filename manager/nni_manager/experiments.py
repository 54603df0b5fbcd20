"""Experiments by id, as `nnictl` users name them: find, list and stop.

An experiment is a directory `<experimentWorkingDirectory>/<id>` holding `experiment.db`. Ids
are found in NNI's manifest (`~/nni-experiments/.experiment`, whose `logDir` says which working
directory, and whose `pid` which process serves it) and under the default working directory
`~/nni-experiments`, so `nni-manager trials ID` works wherever the config put it.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from nni_manager.store import DB_NAME
from nni_manager.webui import manifest

DEFAULT_ROOT = Path("~/nni-experiments")


class ExperimentNotFound(LookupError):
    """No experiment answers to that id or directory; the message says where it looked."""


@dataclass(frozen=True)
class ExperimentInfo:
    id: str
    directory: Path | None
    name: str = ""
    status: str = ""
    platform: str = ""
    start_time: int | None = None  # epoch ms
    url: str = ""
    pid: int | None = None  # the nni-manager process serving it, while it runs
    reason: str = ""  # why it ended (a clean finish, Ctrl-C, the tuner's crash, no worker), from its store

    @property
    def running(self) -> bool:
        return self.pid is not None


def resolve(ref: str | Path) -> Path:
    """The experiment directory for a directory path or an experiment id."""
    path = Path(ref).expanduser()
    if (path / DB_NAME).is_file():
        return path
    if path.is_dir() and ("/" in str(ref) or not _is_id(str(ref))):
        raise ExperimentNotFound(f"{path} holds no experiment ({DB_NAME} missing); pass an experiment id or "
                                 "<experimentWorkingDirectory>/<experiment id>, as printed by `nni-manager run`")
    ref = str(ref)
    looked = []
    entry = manifest.read().get(ref)
    if isinstance(entry, dict) and entry.get("logDir"):
        candidate = Path(str(entry["logDir"])).expanduser() / ref
        if (candidate / DB_NAME).is_file():
            return candidate
        looked.append(str(candidate))
    candidate = DEFAULT_ROOT.expanduser() / ref
    if "/" not in ref and (candidate / DB_NAME).is_file():
        return candidate
    looked.append(str(candidate))
    raise ExperimentNotFound(
        f"no experiment {ref!r}: not a directory holding {DB_NAME}, and no such id in {manifest.manifest_path()} "
        f"or {DEFAULT_ROOT}/ (looked at {', '.join(dict.fromkeys(looked))}); `nni-manager list --all` shows them")


def _is_id(ref: str) -> bool:
    return ref.isalnum()


def list_all() -> list[ExperimentInfo]:
    """Every experiment the manifest knows (pids checked) and every one under ~/nni-experiments."""
    found: dict[str, ExperimentInfo] = {}
    for entry in manifest.experiments_info():
        exp_id = str(entry.get("id", ""))
        if not exp_id:
            continue
        log_dir = entry.get("logDir")
        directory = Path(str(log_dir)).expanduser() / exp_id if log_dir else None
        pid = entry.get("pid") if entry.get("status") != "STOPPED" and _is_manager(entry.get("pid"), entry) else None
        pid = pid if isinstance(pid, int) else None  # _is_manager holds only for an int
        urls = entry.get("webuiUrl") or []
        url = str(urls[0]) if isinstance(urls, (list, str)) and urls and pid else ""
        started = entry.get("startTime")
        directory = directory if directory and (directory / DB_NAME).is_file() else None
        status, reason = str(entry.get("status", "")), ""
        if directory is not None and pid is None:  # ended: the store says how (the manifest may predate it)
            stored_status, reason = _ending(directory)
            status = stored_status if stored_status in ("DONE", "ERROR", "STOPPED") else status
        found[exp_id] = ExperimentInfo(
            exp_id, directory, str(entry.get("experimentName") or ""), status, str(entry.get("platform", "")),
            started if isinstance(started, int) else None, url, pid, reason)
    root = DEFAULT_ROOT.expanduser()
    if root.is_dir():
        for db in sorted(root.glob(f"*/{DB_NAME}")):
            directory = db.parent
            if directory.name not in found:
                found[directory.name] = _from_store(directory)
    return sorted(found.values(), key=lambda e: (e.start_time or 0, e.id))


def _from_store(directory: Path) -> ExperimentInfo:
    """What the store says of an experiment that never registered (run with --no-webui)."""
    from nni_manager.store import Store

    try:
        store = Store.open_readonly(directory)
    except Exception:  # noqa: BLE001 - a foreign or broken directory is listed as such
        return ExperimentInfo(directory.name, directory, status="UNREADABLE")
    try:
        row = store.experiment()
    finally:
        store.close()
    config = row.get("config") or {}
    status, reason = _ending(directory)
    return ExperimentInfo(directory.name, directory, str(config.get("experiment_name") or ""),
                          "STOPPED" if status == "RUNNING" else status,  # no live process registered it
                          str((config.get("training_service") or {}).get("platform", "")), row.get("start_time"),
                          reason=reason or ("the manager died without cleaning up" if status == "RUNNING" else ""))


def _ending(directory: Path) -> tuple[str, str]:
    """(status, why it ended) as the experiment's store recorded them at its end."""
    from nni_manager.store import Store

    try:
        store = Store.open_readonly(directory)
    except Exception:  # noqa: BLE001 - a foreign or broken directory: nothing to say
        return "", ""
    try:
        status = str((store.experiment() or {}).get("status", ""))
        return status, store.setting("stop_reason") or ""
    except Exception:  # noqa: BLE001
        return "", ""
    finally:
        store.close()


def stop(ref: str, timeout: float = 120.0) -> ExperimentInfo:
    """SIGTERM the process that runs (or serves) experiment `ref`, as Ctrl-C would stop it, and
    wait until it is gone. Raises ExperimentNotFound, or ProcessLookupError if none runs it."""
    target = next((e for e in list_all() if e.id == ref), None)
    if target is None:
        raise ExperimentNotFound(f"no experiment {ref!r} in {manifest.manifest_path()}; "
                                 "`nni-manager list --all` shows them")
    if target.pid is None:
        raise ProcessLookupError(f"experiment {ref} is not running (status {target.status or 'unknown'})")
    os.kill(target.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _is_cli(target.pid) or (_is_manager(target.pid, manifest.read().get(ref))
                                  and _status(manifest.read().get(ref)) != "STOPPED"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"experiment {ref}: process {target.pid} still runs {timeout:g} s after SIGTERM")
        time.sleep(0.1)
    return target


def _status(entry: object) -> object:
    """A manifest entry's status (None when the entry is missing or not NNI's)."""
    return entry.get("status") if isinstance(entry, dict) else None


def _is_manager(pid: object, entry: object = None) -> bool:
    """Whether `pid` is a live nni-manager process (not a process that took a dead one's pid):
    the `nni-manager` command, or a Python script running `nni_manager.Experiment` that
    started before its manifest entry was made (a pid taken over later started after it)."""
    if _is_cli(pid):
        return True
    started = entry.get("startTime") if isinstance(entry, dict) else None
    if not isinstance(pid, int) or pid <= 0 or not isinstance(started, int):
        return False
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return False
    began = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat: start time in ticks
    return fields[0] != "Z" and began <= started / 1000 + 1


def _is_cli(pid: object) -> bool:
    """Whether `pid` is a live `nni-manager` command (python -m nni_manager, nni-manager ...)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and (b"nni_manager" in cmdline or b"nni-manager" in cmdline)
