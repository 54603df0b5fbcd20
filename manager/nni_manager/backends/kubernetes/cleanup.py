"""`nni-manager cleanup`: delete what a Kubernetes experiment whose manager died left in the
cluster (a SIGKILL, a lost laptop: its stop never ran). Deleting the experiment's owner
ConfigMap (owner.py) lets the cluster's garbage collector delete every object naming it; then
we wait until the experiment's pods, Secrets, ConfigMaps and Services are gone and say so, one
line per experiment."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nni_manager.backends.base import BackendError
from nni_manager.config import ConfigError

PLATFORMS = ("kubernetes", "kubeflow", "frameworkcontroller", "adl")
GC_WAIT_S = 120.0  # the garbage collector, then the pods' grace periods


def cleanup(ref: str | None, all_orphans: bool) -> Iterator[tuple[bool, str]]:
    """(done, line) per experiment: `ref`, or every stopped Kubernetes experiment known here."""
    from nni_manager.experiments import ExperimentNotFound, list_all, resolve

    known = {e.id: e for e in list_all()}
    if all_orphans:
        targets = [e for e in known.values() if e.platform in PLATFORMS and e.directory is not None]
        if not targets:
            yield True, "no Kubernetes experiment is known here (`nni-manager list --all` shows them)"
        for e in targets:
            assert e.directory is not None
            yield _one(e.id, e.directory, orphans_only=True)
        return
    assert ref is not None
    try:
        directory = resolve(ref)
    except ExperimentNotFound as e:
        yield False, str(e)
        return
    yield _one(directory.name, directory)


def _one(experiment_id: str, directory: Path, orphans_only: bool = False) -> tuple[bool, str]:
    """Under the experiment's lock: a manager that runs it (also one with --no-webui, which no
    manifest lists) is never cleaned up under, nor can one start meanwhile."""
    from nni_manager import experiment_lock

    try:
        experiment_lock.acquire(directory, experiment_id)
    except experiment_lock.ExperimentBusy as e:
        if orphans_only:
            return True, f"experiment {experiment_id}: its manager runs (pid {experiment_lock.holder_pid(directory)}), left alone"
        return False, f"{e}; `nni-manager stop {experiment_id}` stops it and deletes its objects"
    try:
        return _clean_stored(experiment_id, directory)
    finally:
        experiment_lock.release(directory)


def _clean_stored(experiment_id: str, directory: Path) -> tuple[bool, str]:
    from nni_manager.api import _stored_config
    from nni_manager.backends.kubernetes.common import KubeBackend
    from nni_manager.service.hybrid import make_backend

    try:
        backend = make_backend(_stored_config(directory))
    except (ConfigError, RuntimeError, OSError) as e:
        return False, f"experiment {experiment_id}: cannot read its config: {e}"
    if not isinstance(backend, KubeBackend):
        return True, f"experiment {experiment_id}: ran on {backend.platform}, not Kubernetes: nothing to clean up"
    try:
        return asyncio.run(_clean(backend, experiment_id))
    except BackendError as e:  # KubeError: one line already (credentials, RBAC, the API server)
        return False, f"experiment {experiment_id}: {e}"
    except Exception as e:  # noqa: BLE001 - whatever else the client raises, as one line
        return False, f"experiment {experiment_id}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


async def _clean(backend: Any, experiment_id: str) -> tuple[bool, str]:
    from kubernetes.aio import client

    from nni_manager.backends.kubernetes import owner
    from nni_manager.backends.kubernetes.client import load_client

    api = await load_client(backend.kube)
    ns = backend.kube.namespace
    try:
        core = client.CoreV1Api(api)
        deleted = await owner.delete(core, ns, experiment_id)
        left = await owner.remaining(core, ns, experiment_id, GC_WAIT_S if deleted else 0.0)
    finally:
        await api.close()
    if left:
        return False, (f"experiment {experiment_id}: still in namespace {ns}: {', '.join(left)} (made before owner "
                       f"objects, or a pod still ending): delete them with `kubectl delete pods,secrets,configmaps,"
                       f"services -n {ns} -l expId={experiment_id}`")
    if deleted:
        return True, (f"experiment {experiment_id}: deleted its owner ConfigMap {owner.owner_name(experiment_id)} "
                      f"in namespace {ns}; the garbage collector removed its objects")
    return True, f"experiment {experiment_id}: nothing of it is left in namespace {ns}"
