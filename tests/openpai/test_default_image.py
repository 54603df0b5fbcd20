"""OpenPAI with NNI's default image as it really is (`msranni/nni:latest`: Python 3.8 and `nni`,
which brings psutil, but neither grpcio nor protobuf; tests/support/nni_image.py).

With the storage NNI's openpai configs name (`storageConfigName` and both mount points) the
manager ships the agent and its cp38 wheels there and unmodified NNI trial code runs under the
image's Python 3.8. Without them nothing reaches the job but its command, so the trial fails with
the boot step's one line naming exactly what the image lacks (grpcio and protobuf, not psutil) and
the fix, not with PAI's bare `PAIRuntimeUnknownFailed`."""
from __future__ import annotations

from pathlib import Path

import pytest

from nni_manager.service import create_training_service
from tests.support.manager.helpers import form, wait_status
from nni_manager.backends import agent_deps
from tests.support.nni_image import PY38_FINAL, PY38_TRIAL, cp38_wheelhouse, final_results, nni_latest_bin
from tests.support.openpai.experiments import config, ours, run

T = 90.0


def test_default_image_runs_nni_trial_code_with_cp38_wheels_shipped_through_the_storage(
        pai_factory, short_dir: Path, monkeypatch) -> None:
    found, why = nni_latest_bin()
    if found is None:
        pytest.skip(why)
    wheelhouse, why = cp38_wheelhouse()
    if wheelhouse is None:
        pytest.skip(why)
    monkeypatch.setenv(agent_deps.CACHE_ENV, str(short_dir / "wheel-cache"))  # this test's own cache
    pai = pai_factory(rate_limits={"list": 0}, images={"msranni/nni:latest": found})
    storage = pai.storage_dir("confignfs")
    code = short_dir / "nni-code"
    code.mkdir()
    (code / "mnist.py").write_text(PY38_TRIAL)
    cfg = config(pai, short_dir, {"reuseMode": False, "dockerImage": "msranni/nni:latest",
                                  "storageConfigName": "confignfs", "localStorageMountPoint": str(storage),
                                  "containerStorageMountPoint": "/mnt/confignfs"},
                 agentWheelhouse=str(wheelhouse), trialCommand="python3 mnist.py", trialCodeDirectory=str(code))

    metrics: list[str] = []

    async def main() -> tuple[str, str]:
        async with create_training_service(cfg) as ts:
            ts.add_trial_job_metric_listener(lambda m: metrics.append(m.data))
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "SUCCEEDED", "FAILED", timeout=T)
            return d.status.value, d.message

    status, message = run(main())
    assert status == "SUCCEEDED", message
    shipped = sorted(p.name for p in (storage / "nni-agent").glob("deps-*/cp38/*.000"))
    assert any(n.startswith("grpcio-") and "cp38" in n for n in shipped), shipped
    assert not list((storage / "nni-agent").glob("deps-*/cp311")), "only what a source provides is shipped"
    assert final_results(metrics) == [PY38_FINAL], metrics  # NNI SDK code under the image's 3.8


def test_default_image_lacking_grpcio_and_protobuf_fails_with_the_boots_line(pai_factory, short_dir: Path) -> None:
    found, why = nni_latest_bin()
    if found is None:
        pytest.skip(why)
    pai = pai_factory(rate_limits={"list": 0}, images={"msranni/nni:latest": found})
    cfg = config(pai, short_dir, {"reuseMode": False, "dockerImage": "msranni/nni:latest"})

    async def main() -> tuple[str, str]:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            d = await wait_status(ts, t.id, "FAILED", "SUCCEEDED", timeout=T)
            return ts.experiment_id, d.message

    exp, message = run(main())
    assert "nni-agent: Python 3.8" in message and "of the image msranni/nni:latest cannot run the agent" in message, \
        message
    assert "grpcio is missing" in message and "protobuf is missing" in message, message
    assert "psutil" not in message.split("fix:")[0], message  # nni brought it: it is not named missing
    assert "\n" not in message, message
    job = ours(pai, exp)[0]
    assert job["detail"]["jobStatus"]["appExitSpec"]["phrase"] == "PAIRuntimeUnknownFailed"
