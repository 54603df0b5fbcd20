"""The agent's dependencies as wheels for a worker's Python, found by the manager.

A worker whose Python lacks grpcio, protobuf or psutil, and cannot install them itself (no
index behind a firewall, no pip), gets them from the manager: wheels for the worker's exact
CPython version, architecture and C library, resolved here and shipped over the platform's own
channel (SFTP for SSH workers). A wheel installs by unpacking, so the worker needs nothing but
its stdlib.

Where wheels come from, in order: the manager's cache (`~/.cache/nni-agent/wheels`, shared by
every experiment), the directory the user names in `agentWheelhouse` (air-gapped sites fill it
once with `pip download`), then one `pip download` on the manager's host into the cache.
Resolution is ours, not pip's, for the first two: the newest wheel of each requirement whose
tags the worker accepts and whose version is in range, then its own requirements (markers
evaluated for the worker's Python), transitively.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import threading
import sys
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from nni_manager import notices
from nni_manager.backends.agent_wheel import agent_requirements
from nni_manager.backends.base import BackendError

log = logging.getLogger(__name__)

CACHE_ENV = "NNI_AGENT_WHEEL_CACHE"  # overrides the cache directory (tests, shared caches)
DOWNLOAD_ENV = "NNI_AGENT_WHEEL_DOWNLOAD"  # "0": never `pip download` (sites that must not reach an index)
# manylinux tags a worker accepts are those of glibc versions up to its own (PEP 600), plus
# the legacy aliases that name the same baselines (PEP 513/571/599)
_LEGACY = {(2, 5): "manylinux1", (2, 12): "manylinux2010", (2, 17): "manylinux2014"}


class DependencyError(BackendError):
    """The worker's dependencies cannot be found as wheels; the message names what and the fix."""


@dataclass(frozen=True)
class WorkerPython:
    """What decides which wheels a worker can use; reported by the worker itself."""

    version: tuple[int, int]  # (3, 11)
    machine: str  # platform.machine(): x86_64, aarch64
    glibc: tuple[int, int] | None  # None: not glibc (musl, ...), which manylinux wheels do not fit

    @classmethod
    def from_report(cls, report: dict[str, object]) -> WorkerPython:
        """The worker's Python as the boot step's `--check` reports it (`nni_agent/boot.py` `worker()`:
        version "3.11", machine, libc "glibc 2.36")."""
        major, minor = str(report["version"]).split(".")[:2]
        m = re.fullmatch(r"glibc (\d+)\.(\d+).*", str(report.get("libc", "")))
        return cls((int(major), int(minor)), str(report["machine"]), (int(m[1]), int(m[2])) if m else None)

    def describe(self) -> str:
        """The worker's Python in words, where the user knows no better name for it."""
        libc = "glibc %d.%d" % self.glibc if self.glibc else "no glibc"
        return f"workers with Python {self.version[0]}.{self.version[1]} on {self.machine} ({libc})"

    @property
    def key(self) -> str:
        libc = f"glibc{self.glibc[0]}.{self.glibc[1]}" if self.glibc else "noglibc"
        return f"cp{self.version[0]}{self.version[1]}-{self.machine}-{libc}"

    def tags(self) -> list[Tag]:
        """Tags in the worker's preference order: its own ABI first, then abi3, then pure Python."""
        platforms = self.platforms()
        return [*cpython_tags(self.version, platforms=platforms),
                *compatible_tags(self.version, interpreter=f"cp{self.version[0]}{self.version[1]}", platforms=platforms)]

    def platforms(self) -> list[str]:
        if self.glibc is None or self.glibc[0] != 2:
            return []
        arch = self.machine
        out: list[str] = []
        for minor in range(self.glibc[1], 4, -1):  # newest baseline first
            out.append(f"manylinux_2_{minor}_{arch}")
            legacy = _LEGACY.get((2, minor))
            if legacy is not None:
                out.append(f"{legacy}_{arch}")
        return out

    def environment(self) -> dict[str, str]:
        """PEP 508 marker values for the worker (Linux, CPython)."""
        v = f"{self.version[0]}.{self.version[1]}"
        return {"python_version": v, "python_full_version": f"{v}.0", "implementation_name": "cpython",
                "platform_python_implementation": "CPython", "sys_platform": "linux", "os_name": "posix",
                "platform_system": "Linux", "platform_machine": self.machine, "extra": ""}


@dataclass(frozen=True)
class Wheels:
    """The wheels one worker needs: file paths in the cache, and their total size."""

    files: tuple[Path, ...]

    @property
    def size(self) -> int:
        return sum(f.stat().st_size for f in self.files)


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "nni-agent" / "wheels")


def resolve(worker: WorkerPython, wheelhouse: Path | None = None, *, requirements: Sequence[str] | None = None,
            allow_download: bool = True, cache: Path | None = None, where: str = "") -> Wheels:
    """Wheels for every requirement of the agent (and theirs) that `worker` can use.

    Tries the cache and `wheelhouse` first; downloads (one `pip download` into the cache) only
    for what they lack. Raises DependencyError naming the requirements no source has, and says
    so once on the console (`where`: the worker as the user knows it, e.g. "the image X"), since
    that worker's agents then fail at their boot step: every backend that ships dependencies
    comes through here, so none has to remember to say it."""
    try:
        return _resolve(worker, wheelhouse, requirements=requirements, allow_download=allow_download, cache=cache)
    except DependencyError as e:
        notices.deps_unshipped(where or worker.describe(), str(e))
        raise


def _resolve(worker: WorkerPython, wheelhouse: Path | None = None, *, requirements: Sequence[str] | None = None,
             allow_download: bool = True, cache: Path | None = None) -> Wheels:
    reqs = [Requirement(r) for r in (requirements or agent_requirements())]
    cache = cache or cache_dir() / worker.key
    sources = [d for d in (cache, wheelhouse) if d is not None]
    chosen, missing = _pick(worker, reqs, sources)
    if missing and allow_download and os.environ.get(DOWNLOAD_ENV, "1") != "0":
        download(worker, missing, cache)
        chosen, missing = _pick(worker, reqs, sources)
    if missing:
        where = ", ".join(str(d) for d in sources)
        wanted = " ".join(f"'{r}'" for r in missing)
        raise DependencyError(
            f"no wheel for {', '.join(str(r) for r in missing)} fits the worker's Python "
            f"{worker.version[0]}.{worker.version[1]} on {worker.machine} "
            f"({'glibc %d.%d' % worker.glibc if worker.glibc else 'no glibc'}) in {where}. Fix: fill agentWheelhouse "
            f"on a machine with internet: `pip download --only-binary=:all: --python-version "
            f"{worker.version[0]}.{worker.version[1]} --platform manylinux2014_{worker.machine} -d WHEELHOUSE {wanted}`"
            f", or install them into the worker's Python")
    cache.mkdir(parents=True, exist_ok=True)
    files = []
    for f in chosen:  # everything shipped is also in the cache: the next experiment finds it there
        if f.parent != cache:
            dest = cache / f.name
            if not dest.exists():
                tmp = cache / f".{f.name}.{os.getpid()}.{threading.get_ident()}.tmp"  # concurrent resolves: own names
                shutil.copyfile(f, tmp)
                os.replace(tmp, dest)
            f = dest
        files.append(f)
    return Wheels(tuple(sorted(files)))


def _pick(worker: WorkerPython, reqs: list[Requirement], sources: list[Path]) -> tuple[list[Path], list[Requirement]]:
    """Our resolver: the best wheel per requirement, then its requirements (breadth first)."""
    rank = {tag: i for i, tag in enumerate(worker.tags())}
    available: dict[str, list[tuple[Version, int, Path]]] = {}
    for src in sources:
        for path in sorted(src.glob("*.whl")) if src.is_dir() else []:
            try:
                name, version, _, tags = parse_wheel_filename(path.name)
            except ValueError:
                continue
            best = min((rank[t] for t in tags if t in rank), default=None)
            if best is not None:
                available.setdefault(name, []).append((version, -best, path))
    env = worker.environment()
    chosen: dict[str, Path] = {}
    missing: list[Requirement] = []
    todo = list(reqs)
    while todo:
        req = todo.pop(0)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        if name in chosen:
            continue
        fits = [c for c in available.get(name, []) if req.specifier.contains(c[0], prereleases=False)]
        if not fits:
            missing.append(req)
            continue
        path = max(fits, key=lambda c: (c[0], c[1]))[2]
        chosen[name] = path
        todo.extend(_requires(path))
    return list(chosen.values()), missing


def _requires(wheel: Path) -> list[Requirement]:
    """A wheel's own run-time requirements (Requires-Dist without extras)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
        if meta is None:
            return []
        headers = HeaderParser().parsestr(zf.read(meta).decode("utf-8", "replace"))
    out = []
    for line in headers.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and "extra" in str(req.marker):
            if not Marker(str(req.marker)).evaluate({"extra": ""}):
                continue
        out.append(req)
    return out


def download(worker: WorkerPython, reqs: Iterable[Requirement | str], dest: Path) -> None:
    """One `pip download` for the worker's tags into the cache; failures leave it as it was."""
    platforms = worker.platforms()
    if not platforms:
        return
    dest.mkdir(parents=True, exist_ok=True)
    py = f"{worker.version[0]}{worker.version[1]}"
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input", "--quiet",
           "--only-binary=:all:", "--implementation", "cp", "--python-version", py, "--abi", f"cp{py}",
           "--abi", "abi3", "--abi", "none", "--retries", "1", "--timeout", "15", "-d", str(dest)]
    for p in platforms:
        cmd += ["--platform", p]
    cmd += [str(r) for r in reqs]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("pip download of the agent's dependencies for %s failed: %s", worker.key, e)
        return
    if out.returncode != 0:
        log.warning("pip download of the agent's dependencies for %s failed: %s", worker.key,
                    (out.stderr.strip().splitlines() or ["no output"])[-1][:300])


# ---------------------------------------------------------------- platforms with no probe channel
# OpenPAI and AML run nothing cheaper than a job, so the manager cannot ask an image which Python
# it has before the first trial. Those platforms ship wheels for every CPython the agent supports
# (the ones any source can provide), one directory per version, and the job's shell picks its own
# Python's directory (PICK_PYTHON_DIR). x86_64 and manylinux2014 (glibc >= 2.17): what AML and
# OpenPAI's GPU nodes run.
SHIP_PYTHONS: tuple[tuple[int, int], ...] = tuple((3, minor) for minor in range(8, 15))
PYV_VAR = "NNI_PYV"
# sh, after the boot step's interpreter search has set PY: NNI_PYV=cp311 (empty for a Python it cannot run)
PICK_PYTHON_DIR = (f'{PYV_VAR}=$("$PY" -c "import sys; print(\'cp%d%d\' % tuple(sys.version_info[:2]))" '
                   '2>/dev/null || true)')


def sha256_file(path: Path) -> str:
    """The digest the boot step checks a shipped file against (`--sha256 NAME=HEX`)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def digests(files: Iterable[Path], prefix: str = "") -> tuple[tuple[str, str], ...]:
    """(`<prefix><file name>`, sha256) for AgentCommand.sha256: the job's own definition carries
    them, so whoever can write the place the files travel through cannot change what runs."""
    return tuple((f"{prefix}{f.name}", sha256_file(f)) for f in files)


def per_python_digests(per_python: dict[str, Wheels]) -> tuple[tuple[str, str], ...]:
    """`cp311/<wheel>` digests for the per-CPython layout (the boot step takes its own Python's)."""
    return tuple(d for pyv, wheels in sorted(per_python.items()) for d in digests(wheels.files, f"{pyv}/"))


def piece_name(wheel: Path) -> str:
    """A whole wheel as the boot step's `--parts` reads it: one piece, `<wheel>.000`."""
    return f"{wheel.name}.000"


def per_python_layout(per_python: dict[str, Wheels]) -> list[tuple[str, Path]]:
    """(`cp311/<piece>`, wheel) for every wheel of `resolve_for_pythons`: the one layout the job's
    shell picks its own Python's directory from (PICK_PYTHON_DIR), however the files travel."""
    return [(f"{pyv}/{piece_name(f)}", f) for pyv, wheels in sorted(per_python.items()) for f in wheels.files]


def resolve_for_pythons(wheelhouse: Path | None = None, *, machine: str = "x86_64", glibc: tuple[int, int] = (2, 17),
                        versions: Sequence[tuple[int, int]] = SHIP_PYTHONS, where: str = "") -> dict[str, Wheels]:
    """`cp311` -> the wheels for that CPython, for each version some source provides (cache,
    `wheelhouse`, one `pip download` each); versions none provides are left out (their images
    then get the boot step's one line naming what is missing). When none provides any, that is
    said once on the console (`where`: the jobs' image), with the fix for the manager's own
    Python's version (the likeliest image Python; any listed version works the same way)."""
    from concurrent.futures import ThreadPoolExecutor

    errors: dict[tuple[int, int], str] = {}

    def one(version: tuple[int, int]) -> Wheels | None:
        worker = WorkerPython(version, machine, glibc)
        try:
            return _resolve(worker, wheelhouse)
        except DependencyError as e:
            log.debug("no dependency wheels for %s: %s", worker.key, e)
            errors[version] = str(e)
            return None

    with ThreadPoolExecutor(max_workers=4) as pool:  # each may be one `pip download`
        found = list(pool.map(one, versions))
    if versions and not any(found):
        mine = (sys.version_info[0], sys.version_info[1])
        example = errors.get(mine) or errors[max(errors)]
        shown = f"{versions[0][0]}.{versions[0][1]} to {versions[-1][0]}.{versions[-1][1]}"
        notices.deps_unshipped(where or f"jobs' images on {machine}",
                               f"no source has them for any CPython {shown}; for example, {example}")
    return {f"cp{v[0]}{v[1]}": w for v, w in zip(versions, found) if w is not None}
