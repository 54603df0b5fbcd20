"""An emulated image whose Python a non-root uid can run (Pod Security, OpenShift and runAsUser tests)."""
from __future__ import annotations

import os
import shutil
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

NON_ROOT_IMAGE = "nni-test/non-root:3.11"


@pytest.fixture
def non_root_image() -> Iterator[str]:
    """An emulated image whose Python uid 1000 can run: the system python3 with the test venv's
    packages (the venv's own interpreter lives under /root, which only root may enter; pytest's
    tmp_path is 0700 too). As in an image built with `USER 1000` over a system Python."""
    d = Path(tempfile.mkdtemp(prefix="nni-nonroot-image-"))
    os.chmod(d, 0o755)
    site = sysconfig.get_paths()["purelib"]
    for name in ("python3", "python"):
        (d / name).write_text(f'#!/bin/sh\nexport PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site}"\n'
                              'exec /usr/bin/python3 "$@"\n')
        os.chmod(d / name, 0o755)
    yield str(d)
    shutil.rmtree(d, ignore_errors=True)
