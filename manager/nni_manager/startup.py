"""What `run`, `run --detach` and `run --dry-run` check before anything is created, so that the
three agree and a config mistake leaves no experiment directory behind: the algorithms and their
classArgs, the platform's side on this machine (a kubeconfig, a client SDK), and that the
experiment's directory can be written. Each failure is one ConfigError naming the field and fix."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from nni_manager.config import ConfigError, ExperimentConfig

if TYPE_CHECKING:
    from nni_manager.backends.base import Backend


def preflight(config: ExperimentConfig, *, tuner: bool = True) -> Backend[object]:
    """Check everything that needs no network; returns the backend it built for the check.
    `tuner=False`: trials come from elsewhere (an Optuna study), not a tuner and search space."""
    from nni_manager.dispatcher import check_algorithms
    from nni_manager.service.hybrid import make_backend

    if tuner:
        check_algorithms(config)
    backend = make_backend(config)
    backend.preflight()
    _check_manager_address(backend)
    check_writable(Path(config.experiment_working_directory).expanduser())
    return backend


def _check_manager_address(backend: Backend[object]) -> None:
    """A network hub needs the address agents dial, unless the backend finds it (a cluster's
    route, a relay): the same line hub_setup.plan gives at start, now before anything starts."""
    from nni_manager.backends.base import Backend

    if (backend.hub == "network" and not backend.config.training_service.nni_manager_ip
            and type(backend).manager_address is Backend.manager_address and type(backend).hub_route is Backend.hub_route):
        raise ConfigError("nniManagerIp", f"is required for platform {backend.platform}",
                          "set it to an address or DNS name of this machine that the workers can reach")


def check_writable(root: Path) -> None:
    """ConfigError unless `root` is (or can be made) a directory this user writes."""
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError("experimentWorkingDirectory", f"{existing} is not a directory, so {root} cannot be created",
                          "point experimentWorkingDirectory at a directory (default ~/nni-experiments)")
    try:  # a real write, not os.access: root passes access() on a read-only or special file system
        fd, probe = tempfile.mkstemp(prefix=".nni-manager-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        what = root if existing == root else f"{existing} (to create {root} in)"
        raise ConfigError("experimentWorkingDirectory", f"{what} cannot be written ({exc.strerror})",
                          "choose a directory you can write, e.g. ~/nni-experiments, or fix its permissions") from None
