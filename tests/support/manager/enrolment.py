"""A TLS hub with one agent that enrols by credential, for the enrolment tests here and in tests/security."""
from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

from nni_manager.hub import Hub
from nni_manager.hub.tls import experiment_tls
from nni_manager.store import Store
from tests.support.manager.hub_tls import Recorder
from tests.support.manager.hubkit import StoreOwningHub


CREDENTIAL = "enrol-credential-0123456789"


async def enrol_hub(exp_dir: Path, port: int = 0) -> tuple[Hub, Recorder, Path, Store]:
    store = Store.open(exp_dir)
    known = {a["agent_id"]: a for a in store.agents()}
    if "a1" not in known:
        with store.transaction():
            store.add_agent("a1", "a1", CREDENTIAL, {}, enrol=True)
        known = {a["agent_id"]: a for a in store.agents()}
    a = known["a1"]
    material = experiment_tls(exp_dir / "tls", ["127.0.0.1"], "ExpEnrol1")
    rec = Recorder(exp_dir)
    hub = StoreOwningHub(experiment_id="ExpEnrol1", experiment_dir=exp_dir, store=store, handler=rec, tcp=f"127.0.0.1:{port}",
              tls=material)
    hub.register("a1", a["token"], enrol=bool(a["enrol"]), spent=a["spent"])
    await hub.start()
    return hub, rec, exp_dir / "tls" / "ca.crt", store


async def stop_all(procs: list[subprocess.Popen[bytes]], hub: Hub) -> None:
    """End the agent processes still running, then the hub."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
            await asyncio.to_thread(p.wait, 20)
    await hub.stop()


def token_file(path: Path, value: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)
    return path
