"""Fixtures for the WebUI / REST tests: a synthetic stored experiment, an in-process server on
127.0.0.1, a private HOME (the `~/nni-experiments/.experiment` manifest), and Chromium."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nni_manager.store import Store
from nni_manager.types import HyperParameters, TrialJobApplicationForm, TrialJobDetail, TrialJobStatus

T0 = 1_795_000_000_000
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def http(url: str, method: str = "GET", body: Any = None, timeout: float = 30) -> tuple[int, str, bytes]:
    """(status, content type, body) of one request; HTTP errors are answers, not exceptions."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def get_json(url: str) -> Any:
    status, _, body = http(url)
    assert status == 200, (url, status, body[:300])
    return json.loads(body)


def metric(trial_id: str, kind: str, sequence: int, value: Any, parameter_id: int = 0) -> str:
    """An NNI metric message as the SDK sends it: `value` already a JSON string."""
    return json.dumps({"parameter_id": parameter_id, "trial_job_id": trial_id, "type": kind, "sequence": sequence,
                       "value": value if isinstance(value, str) else json.dumps(value)})


CONFIG = {
    "trial_command": "python train.py", "trial_code_directory": "/code", "trial_concurrency": 3,
    "max_trial_number": 200, "max_experiment_duration": 3600.0, "experiment_name": "größe 实验",
    "search_space": {"x": {"_type": "choice", "_value": [1, 2, 3]}, "lr": {"_type": "loguniform", "_value": [1e-4, 0.1]}},
    "tuner": {"name": "Random", "class_args": {"optimize_mode": "maximize"}},
    "training_service": {"platform": "local", "max_trial_number_per_gpu": 1},
    "experiment_working_directory": "/exps",
}


class Synthetic:
    """Writes an experiment store the way the manager does (store API), with varied trials."""

    def __init__(self, directory: Path, experiment_id: str = "synth001") -> None:
        self.dir = directory
        self.store = Store.open(directory)
        self.store.init_experiment(experiment_id, CONFIG, T0)
        self.seq = 0
        self.agent_seq = 0

    def trial(self, trial_id: str, status: TrialJobStatus, params: dict[str, Any], *, message: str = "",
              intermediates: list[Any] = (), final: Any = None, sequences: list[int] | None = None,
              record_extra: dict[str, Any] | None = None) -> None:
        record = {"parameter_id": self.seq, "parameter_source": "algorithm", "parameters": params,
                  "parameter_index": 0, **(record_extra or {})}
        value = json.dumps(record)
        start = T0 + 1000 * self.seq
        ended = status.is_terminal
        detail = TrialJobDetail(
            id=trial_id, status=status, submit_time=start - 5, sequence_id=self.seq,
            form=TrialJobApplicationForm(self.seq, HyperParameters(value, 0)),
            working_directory=str(self.dir / "agents" / trial_id),
            start_time=None if status == TrialJobStatus.WAITING else start,
            end_time=start + 500 if ended else None, message=message)
        with self.store.transaction():
            self.store.save_trial(detail)
            self.store.add_event(trial_id, status, message, start)
            self.store.add_parameter(trial_id, 0, value)
        for i, v in enumerate(intermediates):
            self.add_metric(trial_id, "PERIODICAL", sequences[i] if sequences else i, v)
        if final is not None:
            self.add_metric(trial_id, "FINAL", 0, final)
        self.seq += 1

    def add_metric(self, trial_id: str, kind: str, sequence: int, value: Any, parameter_id: int | None = None) -> None:
        self.agent_seq += 1
        pid = parameter_id if parameter_id is not None else self._pid(trial_id)
        with self.store.transaction():
            self.store.add_metric(trial_id, "agent", "boot", self.agent_seq, self.agent_seq,
                                  metric(trial_id, kind, sequence, value, pid), T0 + self.agent_seq)

    def _pid(self, trial_id: str) -> int:
        return int(json.loads(self.store.parameters(trial_id)[0][1])["parameter_id"])

    def logs(self, trial_id: str, stdout: bytes, stderr: bytes = b"") -> None:
        d = self.dir / "trials" / trial_id
        d.mkdir(parents=True, exist_ok=True)
        (d / "trial.stdout").write_bytes(stdout)
        (d / "trial.stderr").write_bytes(stderr)


class ServerThread:
    """A WebServer for a stored experiment on its own event loop thread, port chosen by the
    system, loopback only; `stopped` is set by DELETE /experiment."""

    def __init__(self, experiment_dir: Path, url_prefix: str = "", register: bool = False, **options: Any) -> None:
        self.dir, self.prefix, self.register, self.options = experiment_dir, url_prefix, register, options
        self.loop = asyncio.new_event_loop()
        self.stopped = threading.Event()
        self.server: Any = None
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ServerThread:
        from nni_manager.webui.server import WebServer, experiment_end_time
        from nni_manager.webui.sides import StoredExperiment

        self.thread.start()
        store = Store.open_readonly(self.dir)
        stored = store.experiment()
        store.close()
        side = StoredExperiment(self.dir, stored, experiment_end_time(self.dir), self.stopped.set)
        self.server = WebServer(side, port=0, url_prefix=self.prefix, register=self.register, **self.options)
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(30)
        return self

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def api(self) -> str:
        return self.server.url + "api/v1/nni"

    @property
    def port(self) -> int:
        return int(self.server.port)

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private HOME: NNI's manifest lives in ~/nni-experiments, for us and for nnictl."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    return h


def nni_installed() -> bool:
    import importlib.util

    if importlib.util.find_spec("nni") is None:
        return False
    return True


needs_nni = pytest.mark.skipif(not nni_installed(), reason="the real `nni` package is not installed "
                               "(pip install nni==3.0; scripts/test.sh does)")


def _ensure_chromium() -> str | None:
    """Why no browser can run, or None. As root, installs Debian's chromium when missing."""
    if not os.path.exists(CHROMIUM) and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"],
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, capture_output=True, timeout=600)
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} is missing and cannot be installed here (apt-get install chromium, as root)"
    import importlib.util

    if importlib.util.find_spec("playwright") is None:
        return "the `playwright` package is missing (pip install '.[test]')"
    return None


@pytest.fixture(scope="module")  # sync_playwright keeps an event loop running: not beyond this module
def browser() -> Iterator[Any]:
    """A Chromium context (Debian's binary, never a downloaded one) with a fresh profile."""
    why = _ensure_chromium()
    if why:
        pytest.skip(why)
    if not nni_installed():
        pytest.skip("the real `nni` package (which ships the WebUI) is not installed")
    import tempfile

    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="webui-chromium-")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                                       headless=True, viewport={"width": 1400, "height": 1000})
        try:
            yield context
        finally:
            context.close()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def artifacts(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Where screenshots go: $NNI_TEST_ARTIFACTS/<test name>, else the test's tmp dir."""
    root = os.environ.get("NNI_TEST_ARTIFACTS")
    d = Path(root) / request.node.name if root else tmp_path / "artifacts"
    d.mkdir(parents=True, exist_ok=True)
    return d


CLI = [sys.executable, "-m", "nni_manager"]
