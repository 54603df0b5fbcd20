"""Fixtures `pai` and `pai_factory`: an OpenPAI rest-server emulator in its own process.

``pai.url`` is what NNI calls ``host``: clients add ``/rest-server/api/v2/...`` as they do behind
PAI's pylon (``/api/v2/...`` works too). See tests/support/openpai/emulator/README.md."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.emulators import EmulatorHandle, emulator_factory, start_emulator_process
from tests.support.schemas import schemas_dir

ROOT = Path(__file__).resolve().parents[3]


class Pai(EmulatorHandle):
    """A running emulator: PAI coordinates for a client, plus test controls (``/_emulator``)."""

    marker = "PAI_EMULATOR_INSTANCE"
    stop_wait = 20.0
    kill_leftovers_on_stop = False  # the factory kills and reports them

    def __init__(self, state_dir: Path, proc: subprocess.Popen, users: dict, control_token: str):
        self.state_dir, self.proc, self.users, self.control_token = state_dir, proc, users, control_token
        self.port = int((state_dir / "port").read_text())
        self.instance = (state_dir / "instance").read_text()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api = self.url + "/rest-server/api/v2"
        self.username = next(iter(users))
        self.token = users[self.username]["token"]

    def token_of(self, user: str) -> str:
        return self.users[user]["token"]

    # ------------------------------------------------------------ controls
    def _call(self, method: str, path: str, body: dict | None = None):
        req = urllib.request.Request(self.url + "/_emulator" + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {self.control_token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code == 409:
                return json.loads(e.read())
            raise

    def fault(self, mode: str = "error", *, count: int | None = None, seconds: float | None = None,
              status: int = 500, body=None, method: str | None = None, path: str | None = None,
              hang_seconds: float = 3600) -> dict:
        """Make PAI API requests fail: ``mode`` "error" (``status``; 500 -> UnknownError JSON,
        502/503/504 -> pylon's nginx page; or your ``body``), "hang" (no answer for ``hang_seconds``)
        or "reset" (connection dropped). For the next ``count`` matching requests and/or ``seconds``
        (default: the next one). ``method``/``path`` (regex on ``/api/v2/...``) narrow the match."""
        return self._call("POST", "/faults", {"mode": mode, "count": count, "seconds": seconds, "status": status,
                                              "body": body, "method": method, "path": path,
                                              "hangSeconds": hang_seconds})

    def clear_faults(self) -> None:
        self._call("DELETE", "/faults")

    def set_capacity(self, vc: str = "default", *, tasks: int | None = None, cpu: int | None = None,
                     memoryMB: int | None = None, gpu: int | None = None, **more) -> dict:
        """Set a VC's limits (None = unlimited). Waiting jobs start when they fit."""
        return self._call("PUT", f"/virtual-clusters/{vc}",
                          {"tasks": tasks, "cpu": cpu, "memoryMB": memoryMB, "gpu": gpu, **more})

    def jobs(self) -> list[dict]:
        """Every job: the list item of the PAI API plus its ``detail`` (no auth, no rate limit)."""
        return self._call("GET", "/jobs")

    def job(self, name: str, user: str | None = None) -> dict | None:
        fw = f"{user or self.username}~{name}"
        return next((j["detail"] for j in self.jobs() if f"{j['username']}~{j['name']}" == fw), None)

    def live_pids(self) -> list[int]:
        """Pids of every live task process (and descendants) this emulator started."""
        return [p["pid"] for p in self._call("GET", "/pids")["pids"]]

    def kill_task(self, job: str, role: str, index: int = 0, *, node_lost: bool = False,
                  user: str | None = None) -> bool:
        """Kill a task's processes from outside (SIGKILL -> exit 137; ``node_lost`` -> -1001 PodNodeLost)."""
        fw = f"{user or self.username}~{job}"
        return self._call("POST", f"/jobs/{fw}/taskRoles/{role}/{index}/kill", {"nodeLost": node_lost})["killed"]

    def storage_dir(self, name: str = "confignfs") -> Path:
        """The directory backing storage `name` (what a manager-side mount of it shows)."""
        return self.state_dir / "storages" / name

    def requests(self) -> list[dict]:
        """PAI API requests received: method, path, query, contentType, status."""
        return self._call("GET", "/requests")

    def wait_state(self, name: str, *states: str, timeout: float = 20.0, user: str | None = None) -> dict:
        def check():
            d = self.job(name, user)
            return d if d and d["jobStatus"]["state"] in states else None
        return self.wait_for(check, timeout, what=f"job {name} in {states}")



def start_emulator(base: Path, *, users: dict | None = None, virtual_clusters: dict | None = None,
                   grace: float = 2.0, rate_limits: dict | None = None, rate_windows: dict | None = None,
                   images: dict | None = None) -> Pai:
    """``users``: {name: {admin, virtualClusters, storages}} (tokens are generated);
    ``virtual_clusters``: {name: {tasks, cpu, memoryMB, gpu}} (None = unlimited); ``rate_limits`` /
    ``rate_windows``: {api|list|submit: requests / seconds} (the rest-server's: 600/60 s, 60/60 s,
    60/3600 s). Each storage is backed by ``state/storages/<name>`` (``Pai.storage_dir``).
    ``images``: {image uri: bin dir put first on PATH}, what that image holds (others: the host's)."""
    schemas_dir()  # every submission is checked with the published job protocol: SchemasMissing skips
    state = base / f"pai-{secrets.token_hex(3)}"
    state.mkdir(parents=True)
    users = users or {"alice": {"virtualClusters": ["default", "vc2"], "storages": ["confignfs"]}}
    users = {n: {"token": secrets.token_urlsafe(24), **u} for n, u in users.items()}
    vcs = virtual_clusters if virtual_clusters is not None else {"default": {}, "vc2": {"tasks": 1}}
    control = secrets.token_urlsafe(24)
    cfg = state / "config.json"
    fd = os.open(cfg, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"users": users, "virtualClusters": vcs, "controlToken": control,
                   "storageServers": _storage_servers(state, users), "images": images or {}}, f)
    args = ["--grace", str(grace)]
    for k, v in (rate_limits or {}).items():
        args += ["--rate-limit", f"{k}={v}"]
    for k, v in (rate_windows or {}).items():
        args += ["--rate-window", f"{k}={v}"]
    proc = start_emulator_process("tests.support.openpai.emulator", state, args, what="OpenPAI emulator",
                                  drop_env=("PAI_EMULATOR_",))
    return Pai(state, proc, users, control)


def _storage_servers(state: Path, users: dict) -> dict[str, str]:
    """A directory per storage name, standing for the storage's server (e.g. an NFS export)."""
    out = {}
    for u in users.values():
        for name in u.get("storages") or []:
            d = state / "storages" / name
            d.mkdir(parents=True, exist_ok=True)
            out[name] = str(d)
    return out


@pytest.fixture
def pai_factory():
    """``pai_factory(users=..., virtual_clusters=..., grace=..., rate_limits=...)`` -> Pai; all are
    stopped at teardown, and the test fails if any task process outlived its emulator."""
    with emulator_factory("pai-emu-", start_emulator, "the OpenPAI emulator") as make:
        yield make


@pytest.fixture(scope="module")
def pai_shared():
    """One emulator (as `pai`) for a module's tests whose every request is refused: they create no
    job, so they need no fresh one (each still checks `pai.jobs() == []`)."""
    with emulator_factory("pai-emu-", start_emulator, "the OpenPAI emulator") as make:
        yield make()


@pytest.fixture
def pai(pai_factory) -> Pai:
    """User ``alice`` (VCs ``default`` unlimited and ``vc2`` with room for 1 task; storage ``confignfs``)."""
    return pai_factory()
