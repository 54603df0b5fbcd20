"""The agent unpacks bundles safely with and without PEP 706's tarfile filter.

Python 3.11.2 (Debian 12's own) and other patch releases have no `filter=` argument; the
agent's own checks must refuse exactly what the filtered path refuses. Each hostile archive
runs through both paths, and nothing may appear outside the target.
"""
from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from nni_agent.safe_tar import HAS_DATA_FILTER, UnsafeArchiveError, extract_all

PATHS = [
    pytest.param(False, id="own-checks"),
    pytest.param(True, id="data-filter", marks=pytest.mark.skipif(
        not HAS_DATA_FILTER, reason="this Python's tarfile has no data filter (PEP 706)")),
]


def _file(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def _entry(name: str, kind: bytes, linkname: str = "", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, mode
    return info, b""


def _archive(tmp: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    path = tmp / "bundle.tar.gz"
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


HOSTILE: dict[str, Callable[[], list[tuple[tarfile.TarInfo, bytes]]]] = {
    "absolute name": lambda: [_file("/tmp/../OUTSIDE/abs.txt")],
    "dotdot name": lambda: [_file("ok/../../OUTSIDE/up.txt")],
    "symlink absolute": lambda: [_entry("link", tarfile.SYMTYPE, "/etc")],
    "symlink out": lambda: [_entry("sub/link", tarfile.SYMTYPE, "../../OUTSIDE")],
    "symlink chain out": lambda: [_entry("a", tarfile.SYMTYPE, "."), _entry("a/b", tarfile.SYMTYPE, "..")],
    "write through link out": lambda: [_entry("l", tarfile.SYMTYPE, "."), _file("l/../../OUTSIDE/w.txt")],
    "hard link out": lambda: [_entry("hard", tarfile.LNKTYPE, "../OUTSIDE/secret.txt")],
    "hard link absolute": lambda: [_entry("hard", tarfile.LNKTYPE, "/etc/passwd")],
    "char device": lambda: [_entry("tty", tarfile.CHRTYPE)],
    "block device": lambda: [_entry("disk", tarfile.BLKTYPE)],
    "fifo": lambda: [_entry("pipe", tarfile.FIFOTYPE)],
}


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """target/ to unpack into, OUTSIDE/ beside it (holding a secret) that must stay untouched."""
    outside = tmp_path / "OUTSIDE"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    target = tmp_path / "work" / "target"
    target.mkdir(parents=True)
    return target, outside


@pytest.mark.parametrize("use_filter", PATHS)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archive_is_refused(case: str, use_filter: bool, layout: tuple[Path, Path], tmp_path: Path) -> None:
    target, outside = layout
    archive = _archive(tmp_path, HOSTILE[case]())
    with tarfile.open(archive) as tar, pytest.raises(UnsafeArchiveError):
        extract_all(tar, target, use_filter=use_filter)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "secret"
    assert not any(p.is_symlink() and not p.resolve().is_relative_to(target.resolve()) for p in target.rglob("*"))
    assert not any(stat.S_ISCHR(p.lstat().st_mode) or stat.S_ISFIFO(p.lstat().st_mode) for p in target.rglob("*"))


@pytest.mark.parametrize("use_filter", PATHS)
def test_plain_bundle_unpacks_with_safe_modes(use_filter: bool, layout: tuple[Path, Path], tmp_path: Path) -> None:
    target, _ = layout
    setuid_file, _ = _file("bin/run.sh", b"#!/bin/sh\necho hi\n", mode=0o4777)
    group_w = _file("data/params.json", b"{}", mode=0o666)
    members = [
        _entry("bin", tarfile.DIRTYPE, mode=0o755),
        (setuid_file, b"#!/bin/sh\necho hi\n"),
        _entry("data", tarfile.DIRTYPE, mode=0o700),
        group_w,
        _file("data/readonly.txt", b"r", mode=0o400),
        _entry("data/alias.json", tarfile.SYMTYPE, "params.json"),
        _entry("bin/copy.sh", tarfile.LNKTYPE, "bin/run.sh", mode=0o755),
    ]
    with tarfile.open(_archive(tmp_path, members)) as tar:
        extract_all(tar, target, use_filter=use_filter)
    run = (target / "bin" / "run.sh").stat()
    assert (target / "bin" / "run.sh").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert stat.S_IMODE(run.st_mode) == 0o755  # setuid and group/other write dropped, still executable
    assert stat.S_IMODE((target / "data" / "params.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((target / "data" / "readonly.txt").stat().st_mode) == 0o600  # the owner can write it
    assert os.readlink(target / "data" / "alias.json") == "params.json"
    assert (target / "data" / "alias.json").read_text() == "{}"
    assert (target / "bin" / "copy.sh").stat().st_ino == run.st_ino
    assert run.st_uid == os.getuid()
