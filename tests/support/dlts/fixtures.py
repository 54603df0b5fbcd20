"""Fixtures `dlts` and `dlts_factory`: a DLTS (DLWorkspace) dashboard emulator in its own process.

See tests/support/dlts/emulator/README.md. The emulator speaks plain HTTP on 127.0.0.1, like a
dashboard behind NNI's `dltsConfig.dashboard: http://.../`.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.emulators import RestControls, emulator_factory, start_emulator_process


ROOT = Path(__file__).resolve().parents[3]
VENV_BIN = str(Path(sys.executable).parent)
MARK = "DLTS_EMULATOR"


class Dlts(RestControls):
    """A running dashboard emulator: its URL, a user's credentials and the test controls."""

    marker = MARK
    job_key = "jobId"

    def __init__(self, state: Path, proc: subprocess.Popen, config: dict, master_token: str):
        self.state, self.proc, self.config = state, proc, config
        self._master_token = master_token
        self.instance: str = config["instance"]
        self.port = int((state / "port").read_text())
        self.url = f"http://127.0.0.1:{self.port}/"          # NNI requires the trailing slash
        self.cluster: str = config["clusters"][0]
        self.team: str = next(iter(config["teams"]))
        self.email: str = config["email"]

    # ------------------------------------------------------------ credentials
    def password(self, email: str | None = None) -> str:
        """The dashboard password of a user: hex(md5('<email>:<masterToken>'))."""
        return hashlib.md5(f"{email or self.email}:{self._master_token}".encode()).hexdigest()

    def auth_query(self, email: str | None = None) -> dict[str, str]:
        return {"email": email or self.email, "password": self.password(email)}

    def dlts_config(self, **overrides) -> dict:
        """NNI's `dltsConfig` section pointing at this emulator."""
        return {"dashboard": self.url, "cluster": self.cluster, "team": self.team, "email": self.email,
                "password": self.password(), **overrides}

    def env(self) -> dict[str, str]:
        """What NNI falls back on when dltsConfig leaves email/password/team out."""
        return {"DLWS_USER_EMAIL": self.email, "DLTS_JOB_TOKEN": self.password(), "DLWS_VC_NAME": self.team}

    # ------------------------------------------------------------ controls
    def _call(self, method: str, path: str, body: dict | None = None):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/_emulator/{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def hold(self, state: str | None) -> None:
        """Jobs stop advancing when they reach `state` (None releases them)."""
        self._call("POST", "hold", {"state": state})

    def step(self, seconds: float) -> None:
        self._call("POST", "step", {"seconds": seconds})

    def pause(self, job_id: str) -> None:
        """An administrator pauses the job (it goes pausing -> paused, its processes killed)."""
        self._call("POST", f"jobs/{job_id}/pause", {})

    def force_status(self, job_id: str, status: str) -> None:
        self._call("POST", f"jobs/{job_id}/status", {"status": status})

    def kill_task(self, job_id: str, sig: int = signal.SIGKILL) -> None:
        """Kill the job's processes from outside (the job then fails)."""
        self._call("POST", f"jobs/{job_id}/kill-task", {"signal": int(sig)})

    def wait_status(self, job_id: str, *statuses: str, timeout: float = 20.0) -> dict:
        return self.wait_for(lambda: (lambda j: j if j["jobStatus"] in statuses else None)(self.job(job_id)),
                             timeout, what=f"job {job_id} in {statuses}")



def start_dlts(base: Path, *, teams: dict | None = None, clusters: list[str] | None = None,
               email: str = "alice@example.com", images: dict[str, str] | None = None, step: float = 0.05,
               hold: str | None = None) -> Dlts:
    """Start an emulator. teams: {name: {gpuType, numGpuPerNode, nodes, members: [emails|'*'], admins: [...]}};
    images: image name -> bin dir put first on the job's PATH ('*' matches any; default: this venv)."""
    state = base / f"dlts-{secrets.token_hex(3)}"
    state.mkdir(parents=True)
    master = secrets.token_hex(16)
    tok = state / "master_token"
    tok.write_text(master)
    os.chmod(tok, 0o600)
    config = {"instance": secrets.token_hex(8), "email": email, "clusters": clusters or ["dlts-cluster"],
              "teams": teams or {"nni-team": {"gpuType": "P40", "numGpuPerNode": 4, "members": ["*"]}},
              "images": images if images is not None else {"*": VENV_BIN}, "step": step, "hold": hold}
    (state / "config.json").write_text(json.dumps(config))
    proc = start_emulator_process("tests.support.dlts.emulator", state, [], what="DLTS emulator", drop_env=(MARK,))
    return Dlts(state, proc, config, master)


@pytest.fixture
def dlts_factory():
    with emulator_factory("dlts-emu-", start_dlts, "the DLTS emulator") as make:
        yield make


@pytest.fixture
def dlts(dlts_factory) -> Dlts:
    return dlts_factory()


@pytest.fixture(scope="session")
def dlts_shared() -> Iterator[Dlts]:
    """One emulator (default options) for the session, for tests that find their jobs by their
    experiment: `dlts_in_shared`."""
    with emulator_factory("dlts-emu-", start_dlts, "the DLTS emulator") as make:
        yield make()


@pytest.fixture
def dlts_in_shared(dlts_shared: Dlts) -> Iterator[Dlts]:
    """`dlts_shared` for one test: afterwards its faults and hold are undone, and it must leave no job
    process running (as a private one's stop checks)."""
    yield dlts_shared
    dlts_shared.clear_faults()
    dlts_shared.hold(None)
    dlts_shared.wait_for(lambda: not dlts_shared.live_pids(), 60, what="no job process left by this test")
