"""Credentials the platform refuses, on every job platform that has its own
(tests/support/job_platforms.py): the experiment does not start, and says why in one line that
names the platform's reason and what to fix, never the secret. Each platform's folder had its own
copy."""
from __future__ import annotations

from pathlib import Path

import pytest

from nni_manager.backends.base import BackendError
from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from tests.support.job_platforms import JobPlatform, run


def test_credentials_the_platform_refuses_stop_the_start_in_one_line(
        job_platform: JobPlatform, request: pytest.FixtureRequest, short_dir: Path) -> None:
    p = job_platform
    data, words, secret = p.wrong_credentials(request, short_dir)
    cfg = load_config(data)

    async def main() -> None:
        async with create_training_service(cfg):
            raise AssertionError("started with credentials the platform refuses")

    with pytest.raises(BackendError) as err:
        run(main())
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), (words, text)
    assert secret is None or secret not in text, text  # None: the secret is the login's, never in the config
