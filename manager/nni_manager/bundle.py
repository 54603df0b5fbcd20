"""Pack a trialCodeDirectory once into a deterministic, content-addressed tar.gz.

Same files -> same bytes -> same digest ("sha256:<hex>"), so agents cache bundles by
digest and a restarted manager serves the same bundle. Honours the root `.nniignore`
(gitignore syntax) and NNI's limits (2,000 files / 300 MB) with an error that names the
biggest offenders, so users know what to ignore.
"""
from __future__ import annotations

import gzip
import hashlib
import logging
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pathspec

MAX_FILES = 2000
MAX_BYTES = 300 * 1024 * 1024
CHUNK_SIZE = 1024 * 1024
log = logging.getLogger(__name__)


class BundleError(ValueError):
    """The code directory cannot be shipped as it is."""


@dataclass(frozen=True)
class Bundle:
    digest: str  # "sha256:<hex>"
    size: int
    path: Path


def collect(code_dir: Path) -> list[tuple[str, Path]]:
    """(archive name, path) of every entry to ship, sorted, `.nniignore` applied."""
    code_dir = code_dir.resolve()
    if not code_dir.is_dir():
        raise BundleError(f"trialCodeDirectory {code_dir} is not a directory")
    ignore_file = code_dir / ".nniignore"
    lines = ignore_file.read_text().splitlines() if ignore_file.is_file() else []
    spec = pathspec.GitIgnoreSpec.from_lines(lines)
    entries: list[tuple[str, Path]] = []
    for root, dirs, files in os.walk(code_dir):
        rel_root = Path(root).relative_to(code_dir)
        kept_dirs = []
        for d in sorted(dirs):
            rel = (rel_root / d).as_posix()
            if spec.match_file(rel + "/"):
                continue
            if os.path.islink(os.path.join(root, d)):
                entries.append((rel, Path(root, d)))  # archived as a link, not followed
            else:
                kept_dirs.append(d)
                entries.append((rel, Path(root, d)))
        dirs[:] = kept_dirs
        for f in sorted(files):
            rel = (rel_root / f).as_posix()
            if spec.match_file(rel):
                continue
            mode = os.lstat(os.path.join(root, f)).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):  # as tar does: a socket or FIFO is no data
                log.warning("trialCodeDirectory: skipping %s: a %s, not a file", rel, _kind(mode))
                continue
            entries.append((rel, Path(root, f)))
    entries.sort()
    return entries


def _kind(mode: int) -> str:
    return ("socket" if stat.S_ISSOCK(mode) else "FIFO" if stat.S_ISFIFO(mode)
            else "device file" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "special file")


def check_limits(code_dir: Path, entries: list[tuple[str, Path]]) -> None:
    """Raise BundleError naming the largest files and directories when over NNI's limits."""
    files = [(name, p.lstat().st_size) for name, p in entries if p.is_file() and not p.is_symlink()]
    total = sum(size for _, size in files)
    if len(files) <= MAX_FILES and total <= MAX_BYTES:
        return
    dirs: dict[str, list[int]] = {}
    for name, size in files:
        top = name.split("/", 1)[0] if "/" in name else ""
        if top:
            stats = dirs.setdefault(top, [0, 0])
            stats[0] += 1
            stats[1] += size
    by_size = sorted(files, key=lambda f: -f[1])[:5]
    by_dir = sorted(dirs.items(), key=lambda d: (-d[1][1], -d[1][0]))[:5]
    if len(files) > MAX_FILES:
        by_dir = sorted(dirs.items(), key=lambda d: (-d[1][0], -d[1][1]))[:5]
    lines = [
        f"trialCodeDirectory {code_dir} has {len(files)} files, {_mb(total)} in all; "
        f"the limits are {MAX_FILES} files and {_mb(MAX_BYTES)}.",
    ]
    if by_dir:
        lines.append("Largest directories: " + ", ".join(f"{d}/ ({c} files, {_mb(s)})" for d, (c, s) in by_dir))
    lines.append("Largest files: " + ", ".join(f"{n} ({_mb(s)})" for n, s in by_size))
    lines.append(f"Add what the trial does not need to {code_dir / '.nniignore'} (gitignore syntax, e.g. `data/`).")
    raise BundleError("\n".join(lines))


def _mb(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MB"


def pack(code_dir: Path, cache_dir: Path) -> Bundle:
    """Pack `code_dir` into <cache_dir>/<hex>.tar.gz (kept if already there)."""
    entries = collect(code_dir)
    check_limits(code_dir, entries)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".packing-{os.getpid()}.tmp"
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, path in entries:
                info = tar.gettarinfo(str(path), arcname=name)
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o755 if info.isdir() or info.mode & 0o111 else 0o644
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    sha = hashlib.sha256()
    with open(tmp, "rb") as f:
        for block in iter(lambda: f.read(CHUNK_SIZE), b""):
            sha.update(block)
    target = cache_dir / f"{sha.hexdigest()}.tar.gz"
    os.replace(tmp, target)
    size = target.stat().st_size
    return Bundle(digest=f"sha256:{sha.hexdigest()}", size=size, path=target)


def cached(cache_dir: Path, digest: str) -> Path | None:
    """The cached bundle file for `digest`, if this experiment made it."""
    algo, _, hexdigest = digest.partition(":")
    if algo != "sha256" or not hexdigest.isalnum():
        return None
    path = cache_dir / f"{hexdigest}.tar.gz"
    return path if path.is_file() else None


def chunks(path: Path, chunk_size: int = CHUNK_SIZE) -> Iterator[tuple[int, bytes, bool]]:
    """(offset, data, last) pieces of a bundle file; an empty file is one empty last chunk."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        offset = 0
        while True:
            data = f.read(chunk_size)
            last = offset + len(data) >= size
            yield offset, data, last
            offset += len(data)
            if last:
                return
