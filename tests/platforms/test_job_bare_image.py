"""An image whose Python cannot run the agent (it lacks the agent's dependencies, or it is older than
3.8), on every job platform that has no way to ship it the dependencies (tests/support/job_platforms.py
`bare_image`): the agent's boot step ends the job with one line, what is wrong and for which image, and
the trial fails at once saying it, never a traceback and never a job that waits for an agent that
cannot start. Where a platform ships them (Kubernetes' ConfigMaps, Slurm's shared filesystem, PAI's
storage, an AML code asset) its own folder runs a bare image to SUCCEEDED. DLTS, AML and OpenPAI had
their own copies."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.job_platforms import BARE_IMAGE, T, JobPlatform, run
from tests.support.manager.helpers import form, wait_status

OLD_PYTHON = Path.home() / ".pyenv" / "versions" / "3.7.16" / "bin" / "python3"
# the image's Python -> what the boot step says of it
PYTHONS = {
    "bare": (Path("/usr/bin/python3"),  # the distribution's Python: no grpcio, no nni-agent
             f"of the image {BARE_IMAGE} cannot run the agent: grpcio is missing; protobuf is missing; psutil is "
             "missing; the nni-agent package is missing"),
    "python3.7": (OLD_PYTHON, f"of the image {BARE_IMAGE} is older than 3.8, the oldest the agent runs on"),
}


@pytest.mark.parametrize("python", list(PYTHONS))
def test_an_image_whose_python_cannot_run_the_agent_fails_with_the_boot_steps_one_line(
        job_platform: JobPlatform, python: str, request: pytest.FixtureRequest, short_dir: Path) -> None:
    p = job_platform
    interpreter, words = PYTHONS[python]
    if not interpreter.exists():
        pytest.skip(f"needs {interpreter} (a Python 3.7 from pyenv)")
    bare = short_dir / "bare-bin"
    bare.mkdir()
    os.symlink(interpreter, bare / "python3")
    emu, data = p.bare_image(request, short_dir, bare)
    cfg = load_config(data)

    async def main() -> str:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0))
            return (await wait_status(ts, t.id, "FAILED", timeout=T)).message

    message = run(main())
    assert "\n" not in message and "Traceback" not in message, message
    if p.boot_line_in_message:
        assert words in message, message
        if python == "bare":
            assert f"; fix: {bare / 'python3'} -m pip install 'grpcio>=" in message, message
    logs = p.job_logs(emu)
    if logs is not None:
        assert logs, "no job wrote a log"
        for text in logs:  # every job tried (a pool tries more than one): the boot step's one line
            lines = text.splitlines()
            assert len(lines) == 1 and lines[0].startswith("nni-agent: Python ") and words in lines[0], lines
