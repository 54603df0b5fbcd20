"""The agent's dependencies shipped to images that lack them, through ConfigMaps.

Nodes need not reach a package index: the manager learns each image's Python (a short probe pod
per image runs the boot step's `--check`, which reports the Python version, machine and C library
and what is missing in its termination message), resolves wheels for it (agent_deps: the cache,
`agentWheelhouse`, or one `pip download` on the manager's host) and stores them in ConfigMaps of
one piece each (a piece <= 900 KiB: the API server refuses objects over 1 MiB, as etcd does).
Pods of that image mount them; the boot step joins the pieces and unpacks them into the pod's
scratch volume. The ConfigMaps are named for their content and outlive the experiment (label
app=nni-agent-deps), so the next experiment in that namespace uploads nothing; a probe's answer is
cached per image on the manager's host (`probes.json` beside the wheel cache), so the next
experiment starts no probe either. Delete both to start afresh.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nni_manager.backends import agent_deps
from nni_manager.backends.agent_command import AgentCommand, inline_source
from nni_manager.backends.kubernetes import boot

log = logging.getLogger(__name__)

PIECE = 900 * 1024  # bytes of wheel per ConfigMap (the API server's limit: 1 MiB of data per object)
DEPS_DIR = "/var/run/nni/deps"  # ConfigMap volumes, one subdirectory per piece
DEPS_APP = "nni-agent-deps"
PROBE_APP = "nni-agent-probe"


@dataclass(frozen=True)
class Shipped:
    """ConfigMaps holding one image's dependency wheels, and where pods unpack them."""

    config_maps: tuple[str, ...]
    key: str  # WorkerPython.key: deps-<key> under the work dir
    size: int  # bytes of wheels
    sha256: tuple[tuple[str, str], ...] = ()  # (wheel file name, sha256): the pod command's --sha256

    def volumes(self) -> list[dict[str, object]]:
        return [{"name": f"nni-deps-{i}", "configMap": {"name": n}} for i, n in enumerate(self.config_maps)]

    def mounts(self) -> list[dict[str, object]]:
        return [{"name": f"nni-deps-{i}", "mountPath": f"{DEPS_DIR}/{i}", "readOnly": True}
                for i in range(len(self.config_maps))]


def probes_file() -> Path:
    return agent_deps.cache_dir() / "probes.json"


def cached_probe(image: str) -> dict[str, object] | None:
    try:
        return json.loads(probes_file().read_text()).get(image)
    except (OSError, ValueError):
        return None


def remember_probe(image: str, report: dict[str, object]) -> None:
    f = probes_file()
    try:
        known = json.loads(f.read_text())
    except (OSError, ValueError):
        known = {}
    known[image] = report
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps(known, indent=1))
    tmp.replace(f)


def worker_python(report: dict[str, Any]) -> agent_deps.WorkerPython:
    """The image's Python as the boot step's `--check` reports it."""
    return agent_deps.WorkerPython.from_report(report)


def needs_shipping(report: dict[str, Any]) -> bool:
    return bool(report.get("fixes"))


def probe_script(command: AgentCommand) -> str:
    """sh for the probe container: find Python as the agent's pods do, then the boot step's check
    (inline, the wheel verified by its digest, as in the agent's pods)."""
    opts = ["--check", "--report", boot.TERMINATION_LOG, "--wheel", command.wheel, "--unpack-to", command.unpack_to]
    for name, digest in command.sha256:
        opts += ["--sha256", f"{name}={digest}"]
    return (command.find_python() + "\n"
            f'exec "$PY" -c {shlex.quote(inline_source())} {" ".join(shlex.quote(o) for o in opts)}')



def pieces(files: tuple[Path, ...]) -> list[tuple[str, bytes]]:
    """(`<wheel>.<nnn>`, bytes) pieces of at most PIECE bytes, in order."""
    out = []
    for f in files:
        data = f.read_bytes()
        for i in range(0, max(len(data), 1), PIECE):
            out.append((f"{f.name}.{i // PIECE:03d}", data[i:i + PIECE]))
    return out


async def ship(core: Any, namespace: str, wheels: agent_deps.Wheels, key: str) -> tuple[Shipped, int]:
    """Create the ConfigMaps (those not there yet); returns them and the bytes uploaded now.

    Each is named for its piece's content and immutable; one already there is reused only when
    it holds exactly that piece (read back and compared), else it is deleted and made again. The
    pods' command carries every wheel's sha256 besides, so a ConfigMap replaced later (deleted and
    made again by someone who may edit ConfigMaps) is refused by the boot step, never run."""
    names, uploaded = [], 0
    for piece, data in await asyncio.to_thread(pieces, wheels.files):
        digest = hashlib.sha256(piece.encode() + b"\0" + data).hexdigest()
        name = f"nni-agent-deps-{digest[:20]}"
        names.append(name)
        encoded = base64.b64encode(data).decode()
        body = {"apiVersion": "v1", "kind": "ConfigMap", "immutable": True,
                "metadata": {"name": name, "namespace": namespace, "labels": {"app": DEPS_APP, "python": key}},
                "binaryData": {piece: encoded}}
        if await ensure_config_map(core, namespace, name, body):
            uploaded += len(data)
    digests = await asyncio.to_thread(agent_deps.digests, wheels.files)
    return Shipped(tuple(names), key, wheels.size, digests), uploaded


async def ensure_config_map(core: Any, namespace: str, name: str, body: dict[str, Any]) -> bool:
    """`body` in the cluster: True when made now; one there already is kept only when it is the
    same immutable content (a ConfigMap someone else planted under the name is replaced)."""
    for _ in range(3):
        try:
            await core.create_namespaced_config_map(namespace, body, field_validation="Strict")
            return True
        except Exception as e:
            if getattr(e, "status", None) != 409:
                raise
        try:
            got = await core.read_namespaced_config_map(name, namespace)
        except Exception as e:
            if getattr(e, "status", None) == 403:  # no `get` on configmaps: the boot step's digests still guard
                log.info("cannot read the ConfigMap %s to compare it (403); the pods verify its content", name)
                return False
            if getattr(e, "status", None) != 404:
                raise
            continue
        if got.immutable and (got.binary_data or {}) == body.get("binaryData", {}) and \
                (got.data or {}) == body.get("data", {}):
            return False  # shipped by an earlier experiment: the same bytes, and nobody can change them
        log.warning("the ConfigMap %s in %s does not hold what the manager ships (changed, or not immutable): "
                    "replacing it", name, namespace)
        try:
            await core.delete_namespaced_config_map(name, namespace)
        except Exception as e:
            if getattr(e, "status", None) != 404:
                raise
    raise agent_deps.DependencyError(f"cannot make the ConfigMap {name} in {namespace}: it is replaced as fast as "
                                     f"the manager makes it; ask the namespace's admin who else writes ConfigMaps")
