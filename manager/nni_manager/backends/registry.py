"""Map an NNI `platform` name to its backend class.

Backends register through the `nni_manager.backends` entry-point group (see pyproject.toml),
so a third-party platform is a package of its own that needs no edit here. Only the backend
a config names is imported.
"""
from __future__ import annotations

import os
import sys
from importlib.metadata import EntryPoint, entry_points

from nni_manager.backends.base import Backend

GROUP = "nni_manager.backends"
# NNI platforms this manager knows of but does not run (yet): a config naming one is told so.
PLANNED: dict[str, str] = {}


_scanned: tuple[tuple[tuple[str, int], ...], dict[str, EntryPoint]] | None = None


def _path_state() -> tuple[tuple[str, int], ...]:
    """What decides which distributions are installed: the path, and each entry's mtime (a
    package installed or removed there changes its directory)."""
    state = []
    for entry in sys.path:
        try:
            state.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            state.append((entry, -1))
    return tuple(state)


def _entry_points() -> dict[str, EntryPoint]:
    """The group's entry points, scanned again only when the path changed: a scan reads every
    installed distribution's metadata (about 60 ms with 130 packages), and loading a config asks
    more than once."""
    global _scanned
    state = _path_state()
    if _scanned is None or _scanned[0] != state:
        _scanned = (state, {ep.name: ep for ep in entry_points(group=GROUP)})
    return dict(_scanned[1])


def platforms() -> list[str]:
    """The `platform` names this manager can run."""
    return sorted(_entry_points())


def backend_class(platform: str) -> type[Backend]:
    """Return the backend class for `platform` or raise ValueError saying what exists."""
    found = _entry_points().get(platform)
    if found is None:
        known = ", ".join(platforms()) or f"none (is nni-agent installed? no `{GROUP}` entry points found)"
        if platform in PLANNED:
            raise ValueError(f"platform {platform!r} ({PLANNED[platform]}) is not implemented in nni-manager yet; "
                             f"supported platforms: {known}")
        raise ValueError(f"unknown platform {platform!r}; supported platforms: {known}")
    cls = found.load()
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ValueError(f"entry point {found.value} for platform {platform!r} is not a Backend subclass")
    return cls
