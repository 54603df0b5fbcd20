"""Submit-to-RUNNING on the Kubernetes emulator: an image without the agent's dependencies (shipped
in ConfigMaps: first experiment probes and uploads, second finds both cached) next to an image that
has them; and the bytes uploaded. Ratios only: the emulator's timings are not a cluster's.

    sudo .venv/bin/python scripts/bench_kube_deps.py   (needs .venv/agent-wheelhouse: scripts/test.sh)
"""
from __future__ import annotations

import asyncio
import base64
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["NNI_AGENT_WHEEL_DOWNLOAD"] = "0"
os.environ["NNI_AGENT_WHEEL_CACHE"] = tempfile.mkdtemp(prefix="nni-bench-cache-")

from nni_manager.service import create_training_service  # noqa: E402
from tests.support.kube.fixtures import start_emulator  # noqa: E402
from tests.support.kube.harness import IMAGE, SLIM_IMAGE, config, pods_service  # noqa: E402
from tests.support.manager.helpers import form, wait_status  # noqa: E402

SEEN: dict[str, int] = {}  # dependency ConfigMaps seen: name -> bytes
WHEELHOUSE = ROOT / ".venv" / "agent-wheelhouse"


async def to_running(kube, base: Path, image: str) -> tuple[float, int]:
    cfg = config(kube, base, pods_service(dockerImage=image), agentWheelhouse=str(WHEELHOUSE))
    t0 = time.monotonic()
    async with create_training_service(cfg) as ts:
        t = await ts.submit_trial_job(form(0))
        await wait_status(ts, t.id, "RUNNING", "SUCCEEDED", timeout=120)
        took = time.monotonic() - t0
    before = SEEN.copy()
    for cm in kube.core().list_namespaced_config_map("default", label_selector="app=nni-agent-deps").items:
        SEEN[cm.metadata.name] = sum(len(base64.b64decode(v)) for v in (cm.binary_data or {}).values())
    return took, sum(v for k, v in SEEN.items() if k not in before)


def main() -> None:
    base = Path(tempfile.mkdtemp(prefix="kbench-", dir="/tmp"))
    kube = start_emulator(base)
    try:
        have0, _ = asyncio.run(to_running(kube, base / "a0", IMAGE))  # its probe (and warm-up)
        have, _ = asyncio.run(to_running(kube, base / "a", IMAGE))  # probe cached, as every later experiment
        first, up1 = asyncio.run(to_running(kube, base / "b", SLIM_IMAGE))
        second, up2 = asyncio.run(to_running(kube, base / "c", SLIM_IMAGE))
    finally:
        kube.stop()
    print(f"start + submit -> RUNNING (emulator): image with deps {have:.2f} s (first, with its probe: {have0:.2f} s); bare image, first "
          f"experiment {first:.2f} s ({first / have:.2f}x), second {second:.2f} s ({second / have:.2f}x)")
    print(f"bytes uploaded (dependency ConfigMaps created): first {up1}, second {up2}; none for the image with deps")


if __name__ == "__main__":
    main()
