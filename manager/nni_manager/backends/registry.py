"""Map an NNI `platform` name to its backend class, importing only the one needed."""
from __future__ import annotations

import importlib

from nni_manager.backends.base import Backend

_BACKENDS: dict[str, str] = {
    "local": "nni_manager.backends.local:LocalBackend",
    "remote": "nni_manager.backends.remote:RemoteBackend",
}


def platforms() -> list[str]:
    """The `platform` names this manager can run."""
    return sorted(_BACKENDS)


def backend_class(platform: str) -> type[Backend]:
    """Return the backend class for `platform` or raise ValueError naming the known ones."""
    try:
        target = _BACKENDS[platform]
    except KeyError:
        known = ", ".join(platforms())
        raise ValueError(f"unknown platform {platform!r}; supported platforms: {known}") from None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
