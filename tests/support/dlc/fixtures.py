"""Fixture `dlc`: the PAI-DLC OpenAPI emulator (tests/support/dlc/emulator) in its own process, over HTTPS,
with one AccessKey pair, one workspace and its NAS/OSS data sources, and an "image" that is the
test's virtual environment's bin directory (it holds python3 and nni-agent)."""
from __future__ import annotations

import json
import secrets
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.emulators import RestControls, emulator_factory, start_emulator_process

MARK = "DLC_EMULATOR"
IMAGE = "registry-vpc.cn-hangzhou.aliyuncs.com/pai-dlc/pytorch-training:1.6.0-gpu-py37-cu101-ubuntu18.04"
VENV_BIN = str(Path(sys.executable).parent)


class Dlc(RestControls):
    marker = MARK
    job_key = "DisplayName"

    def __init__(self, state: Path, proc: subprocess.Popen, cfg: dict[str, Any]) -> None:
        self.state, self.proc, self.cfg = state, proc, cfg
        self.instance = cfg["instance"]
        self.port = int((state / "port").read_text())
        self.endpoint = f"127.0.0.1:{self.port}"
        self.ca_file = str(state / "ca.crt")
        (self.access_key_id, key), = [(k, v) for k, v in cfg["accessKeys"].items() if v["user"] == "alice"]
        self.access_key_secret = key["secret"]
        self._ssl = ssl.create_default_context(cafile=self.ca_file)

    def training_service(self, **overrides: Any) -> dict[str, Any]:
        """NNI's `trainingService` for this emulator (config_dlc.yml's fields, the endpoint and its CA)."""
        return {"platform": "dlc", "type": "Worker", "image": IMAGE, "jobType": "PyTorchJob", "podCount": 1,
                "ecsSpec": "ecs.c6.large", "region": "cn-hangzhou", "workspaceId": "ws-nni",
                "accessKeyId": self.access_key_id, "accessKeySecret": self.access_key_secret,
                "nasDataSourceId": "data-nas-1", "ossDataSourceId": "data-oss-1",
                "localStorageMountPoint": "/home/admin/workspace/", "containerStorageMountPoint": "/root/data/",
                "endpoint": self.endpoint, "caFile": self.ca_file, "pollInterval": "0.3s", **overrides}

    def hold(self, status: str | None) -> None:
        """Jobs stop advancing when they reach `status` (None releases them)."""
        self._call("POST", "hold", {"status": status})

    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        req = urllib.request.Request(f"https://{self.endpoint}/_emulator/{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=self._ssl, timeout=30) as r:
            return json.loads(r.read())


def start_dlc(base: Path, *, step: float = 0.05, images: dict[str, str] | None = None) -> Dlc:
    """`images`: {image: bin dir put first on PATH}, more images than DLC's PyTorch one (the venv's)."""
    state = base / f"dlc-{secrets.token_hex(3)}"
    state.mkdir(parents=True)
    cfg = {"instance": secrets.token_hex(8), "step": step, "images": {IMAGE: VENV_BIN, **(images or {})},
           "accessKeys": {"LTAI" + secrets.token_hex(10): {"secret": secrets.token_urlsafe(22), "user": "alice",
                                                           "workspaces": ["ws-nni"]},
                          "LTAI" + secrets.token_hex(10): {"secret": secrets.token_urlsafe(22), "user": "bob",
                                                           "workspaces": ["ws-other"]}},
           "workspaces": {"ws-nni": {"dataSources": [{"DataSourceId": "data-nas-1", "DataSourceType": "nas"},
                                                     {"DataSourceId": "data-oss-1", "DataSourceType": "oss"}]},
                          "ws-other": {"dataSources": []}}}
    (state / "config.json").write_text(json.dumps(cfg))
    proc = start_emulator_process("tests.support.dlc.emulator", state, [], what="PAI-DLC emulator", drop_env=(MARK,))
    return Dlc(state, proc, cfg)


@pytest.fixture
def dlc_factory():
    with emulator_factory("dlc-emu-", start_dlc, "the PAI-DLC emulator") as make:
        yield make


@pytest.fixture
def dlc(dlc_factory) -> Dlc:
    return dlc_factory()


@pytest.fixture(scope="session")
def dlc_shared() -> Iterator[Dlc]:
    """One emulator for the session, for tests that find their jobs by their experiment and change
    nothing in the emulator (no credentials, steps or faults of their own): `dlc_in_shared`."""
    with emulator_factory("dlc-emu-", start_dlc, "the PAI-DLC emulator") as make:
        yield make()


@pytest.fixture
def dlc_in_shared(dlc_shared: Dlc) -> Iterator[Dlc]:
    """`dlc_shared` for one test, which must leave no job process running (as a private one's stop
    checks); afterwards its faults and hold are undone."""
    yield dlc_shared
    dlc_shared.clear_faults()
    dlc_shared.hold(None)
    dlc_shared.wait_for(lambda: not dlc_shared.live_pids(), 60, what="no job process left by this test")
