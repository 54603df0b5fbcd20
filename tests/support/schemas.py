"""Where the published schemas are (``shared/schemas``, kept outside the project), and what a test
does without them: the emulators that validate with them (the Kubernetes API server's custom
resources, OpenPAI's job protocol) raise `SchemasMissing`, and tests/conftest.py turns that into a
skip naming the reason, so a fresh clone that is not beside ``shared/`` runs every other test."""
from __future__ import annotations

import os
from pathlib import Path

SCHEMAS_ENV = "NNI_SHARED_SCHEMAS"
REPO = Path(__file__).resolve().parents[2]


class SchemasMissing(FileNotFoundError):
    """No ``shared/schemas`` above the repository and no $NNI_SHARED_SCHEMAS: the tests that need
    them are skipped with this message (a wrong $NNI_SHARED_SCHEMAS stays an error)."""


def schemas_dir() -> Path:
    """``shared/schemas``: $NNI_SHARED_SCHEMAS, else the first ``<ancestor>/shared/schemas`` of the
    repository root (normally ``<repo>/../shared/schemas``)."""
    env = os.environ.get(SCHEMAS_ENV)
    if env:
        if Path(env).is_dir():
            return Path(env)
        raise FileNotFoundError(f"{SCHEMAS_ENV}={env!r} is not a directory with the published schemas")
    looked = []
    for base in [REPO, *REPO.parents]:
        cand = base / "shared" / "schemas"
        looked.append(str(cand))
        if cand.is_dir():
            return cand
    raise SchemasMissing("published schemas (shared/schemas) not found; looked in: " + ", ".join(looked)
                         + f"; set {SCHEMAS_ENV} to the directory")
