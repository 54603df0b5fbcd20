"""Images as the emulators run them: an image name maps to a directory put first on PATH.

`python:3.11-slim` stands for a stock image with nothing but Python: the system interpreter
(/usr/bin/python3, Debian's, outside any venv), so it has neither the agent, grpcio, protobuf nor
psutil, and none of the test's environment. NNI's default image is in nni_image.py.
"""
from __future__ import annotations

from pathlib import Path

SLIM_IMAGE = "python:3.11-slim"


def slim_python_dir(base: Path) -> str:
    """A bin directory under `base` whose python3 and python are the system interpreter."""
    d = base / "image-python-slim"
    d.mkdir(exist_ok=True)
    for n in ("python3", "python"):
        if not (d / n).is_symlink():
            (d / n).symlink_to("/usr/bin/python3")
    return str(d)
