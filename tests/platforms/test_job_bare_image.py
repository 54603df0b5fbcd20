"""An image whose Python cannot run the agent, on every job platform that has no way to ship it its
dependencies (tests/support/job_platforms.py `bare_image`): the agent's boot step ends the job with
one line, what is missing and for which image, and the trial fails at once saying it, never a
traceback and never a job that waits for an agent that cannot start. Where a platform ships them
(Kubernetes' ConfigMaps, Slurm's shared filesystem, PAI's storage, an AML code asset) its own folder
runs a bare image to SUCCEEDED. DLTS and AML had their own copies."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.job_platforms import BARE_IMAGE, T, JobPlatform, run
from tests.support.manager.helpers import form, wait_status

MISSING = (f"of the image {BARE_IMAGE} cannot run the agent: grpcio is missing; protobuf is missing; psutil is "
           "missing; the nni-agent package is missing")


def test_an_image_without_the_agents_dependencies_fails_with_the_boot_steps_one_line(
        job_platform: JobPlatform, request: pytest.FixtureRequest, short_dir: Path) -> None:
    p = job_platform
    bare = short_dir / "bare-bin"
    bare.mkdir()
    os.symlink("/usr/bin/python3", bare / "python3")  # the distribution's Python: no grpcio, no nni-agent
    emu, data = p.bare_image(request, short_dir, bare)
    cfg = load_config(data)

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            return (await wait_status(ts, t.id, "FAILED", timeout=T)).message

    message = run(main())
    assert "\n" not in message and "Traceback" not in message, message
    if p.boot_line_in_message:
        assert MISSING in message, message
        assert f"; fix: {bare / 'python3'} -m pip install 'grpcio>=" in message, message
    logs = p.job_logs(emu)
    if logs is not None:
        assert logs, "no job wrote a log"
        for text in logs:  # every job tried (a pool tries more than one): the boot step's one line
            lines = text.splitlines()
            assert len(lines) == 1 and lines[0].startswith("nni-agent: Python ") and MISSING in lines[0], lines
