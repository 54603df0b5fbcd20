"""`~/nni-experiments/.experiment`: NNI's list of experiments, with NNI's lock-file protocol.

`nnictl` finds an experiment's port and pid only here (and marks entries whose pid is dead
STOPPED), `Experiment.connect()` reads our pid through `/experiments-info`. The lock is NNI's
`SimplePreemptiveLock` (nnictl/common_utils.py) and the TS manager's: create
`.experiment.lock.<pid>` exclusively, unless another `.experiment.lock.*` younger than 2 s
exists; read, modify, write; delete the lock. A file that exists but cannot be read or parsed
is never rewritten (that would drop every other experiment's entry): a warning says why.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from nni_manager.jsontypes import JSONValue

# experiment id -> its entry (a JSON object: id, port, pid, status, logDir, webuiUrl, ...); the
# file is also NNI's, so entries are read as JSON and narrowed where used
Manifest = dict[str, JSONValue]

log = logging.getLogger(__name__)
_STALE_S = 2.0
_TRIES, _WAIT_S = 100, 0.05


def manifest_path() -> Path:
    """Fixed to the home directory, as in NNI (`NNI_HOME_DIR`), whatever the experiment's dir."""
    return Path.home() / "nni-experiments" / ".experiment"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    mine = Path(f"{path}.lock.{os.getpid()}")
    fd = None
    for _ in range(_TRIES):
        now = time.time()
        others = []
        for p in path.parent.glob(path.name + ".lock.*"):
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime < _STALE_S:
                    others.append(p)
        if not others:
            try:
                fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_TRUNC, 0o600)
                break
            except OSError:
                pass
        time.sleep(_WAIT_S)
    try:  # after 5 s a lock is left over by a crash: go on, as NNI's TS side does
        yield
    finally:
        if fd is not None:
            os.close(fd)
            with contextlib.suppress(OSError):
                mine.unlink()


def _load(path: Path) -> tuple[Manifest | None, str]:
    """(entries, "") ; ({}, "") for a missing file; (None, why) for one that cannot be used."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, ""
    except (OSError, ValueError) as exc:
        return None, str(exc)
    if not isinstance(data, dict):
        return None, f"it holds a {type(data).__name__}, not NNI's mapping of experiments"
    return data, ""


def read(path: Path | None = None) -> Manifest:
    data, _ = _load(path or manifest_path())
    return data or {}


def update(change: Callable[[Manifest], object], path: Path | None = None) -> Manifest:
    """Apply `change` to the whole manifest under the lock; returns what was written ({} and
    nothing written when the file exists but cannot be read or parsed)."""
    path = path or manifest_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        data, why = _load(path)
        if data is None:
            log.warning("not updating %s: cannot read it (%s); rewriting it would drop other experiments' "
                        "entries (nnictl will not list this experiment until the file is repaired)", path, why)
            return {}
        change(data)
        tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=4), encoding="utf-8")
        os.replace(tmp, path)
    return data


def register(entry: Mapping[str, JSONValue], path: Path | None = None) -> None:
    """Add (or replace) this experiment's entry, as NNI's launcher does."""
    update(lambda d: d.__setitem__(str(entry["id"]), dict(entry)), path)


def set_fields(experiment_id: str, path: Path | None = None, **fields: JSONValue) -> None:
    """Update status / endTime / port of our entry; a None value removes the key (as NNI)."""
    def change(d: Manifest) -> None:
        entry = d.get(experiment_id)
        if not isinstance(entry, dict):  # absent (or not NNI's: left alone)
            return
        for key, value in fields.items():
            if value is None:
                entry.pop(key, None)
            else:
                entry[key] = value
    update(change, path)


def experiments_info(path: Path | None = None) -> list[dict[str, JSONValue]]:
    """`/experiments-info`: every entry; those whose pid is dead become STOPPED without a port
    (NNI rewrites the file likewise)."""
    stale: list[str] = []

    def change(d: Manifest) -> None:
        for key, entry in d.items():
            if not isinstance(entry, dict) or entry.get("status") == "STOPPED":
                continue
            pid = entry.get("pid")
            if isinstance(pid, int) and not alive(pid):
                entry["status"] = "STOPPED"
                entry.pop("port", None)
                stale.append(key)
    data = read(path)
    if any(isinstance(e, dict) and e.get("status") != "STOPPED" and isinstance(pid := e.get("pid"), int)
           and not alive(pid) for e in data.values()):
        data = update(change, path)
    return [e for e in data.values() if isinstance(e, dict)]


def alive(pid: int) -> bool:
    """Whether process `pid` exists (one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
