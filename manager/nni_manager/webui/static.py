"""The WebUI's files, found at run time in the user's installed `nni` package.

NNI's wheel ships the built WebUI as `nni_node/static`; we never copy it into this project.
`nni_node/__init__.py` is one docstring line, so `find_spec` locates it without importing NNI.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path

NO_WEBUI_PAGE = (
    "<!doctype html><title>NNI WebUI not installed</title>"
    "<p>NNI's WebUI comes from the <code>nni</code> package: <code>pip install nni==3.0</code> "
    "next to nni-manager, then reload; the REST API is up at <code>api/v1/nni/</code>.</p>\n"
)


def webui_dir() -> Path | None:
    """`.../site-packages/nni_node/static` if nni is installed with its WebUI, else None.

    `NNI_MANAGER_WEBUI_DIR` overrides it (an empty value means: no WebUI), for tests and for
    users with a WebUI built from NNI's sources.
    """
    override = os.environ.get("NNI_MANAGER_WEBUI_DIR")
    if override is not None:
        path = Path(override)
        return path if override and (path / "index.html").is_file() else None
    try:
        spec = importlib.util.find_spec("nni_node")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        static = Path(location) / "static"
        if (static / "index.html").is_file():
            return static
    return None


def nni_version() -> str:
    """What NNI's `/version` answers: the installed nni's version ("3.0"), else our own."""
    for name in ("nni", "nni-agent"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "0.0.0"
