"""OpenPAI with NNI's default image as it really is (`msranni/nni:latest`: Python 3.8 and `nni`,
which brings psutil, but neither grpcio nor protobuf; tests/support/nni_image.py). Without
`storageConfigName` and both mount points nothing reaches the job but its command, so the trial
fails with the boot step's one line naming exactly what the image lacks (grpcio and protobuf, not
psutil) and the fix, not with PAI's bare `PAIRuntimeUnknownFailed`."""
from __future__ import annotations

from pathlib import Path

import pytest

from nni_manager.service import create_training_service
from tests.support.manager.helpers import form, wait_status
from tests.support.nni_image import nni_latest_bin
from tests.support.openpai.experiments import config, ours, run

T = 90.0


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
